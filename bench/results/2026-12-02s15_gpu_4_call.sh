#!/bin/bash
# session 15 call 4: OLMoE at 24 GiB, bf16 state, no clip: held-gradient count sweep (head + 2, 3,
# planner's 4, 5 layers) in one call, traced (the step model F + 31 h + 70 (15 - h) ms of the notes)
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1 --max-grad-norm 0"
for c in 900000000 1300000000 auto 2100000000; do
  [ $(el) -gt 420 ] && break
  if [ $c = auto ]; then unset SF_HOLD_GRADS; else export SF_HOLD_GRADS=$c; fi
  t0=$(date +%s); SF_TRACE=$L/trolmoe_$c.jsonl timeout 100 $B bench --preset olmoe-1b-7b $O --gpu-memory 24GiB --optimizer-state bf16 > $L/olmoe_$c.json 2> $L/olmoe_$c.log; echo "olmoe_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/olmoe_$c.log | cut -c1-300
  python3 tools/trace_summary.py $L/trolmoe_$c.jsonl --layers > $L/trolmoe_$c.txt 2>&1; sed -n 6,7p $L/trolmoe_$c.txt | cut -c1-500
  pack
done
unset SF_HOLD_GRADS
echo total $(el)s
