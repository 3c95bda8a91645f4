#!/bin/bash
# session 15 call 5: OLMoE at 24 GiB, bf16 state, no clip, beside PyTorch in one call: head + 3
# layers held (1.3 G, call 4's best) twice against the planner's 4 (1.68 G)
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1 --max-grad-norm 0"
timeout 120 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm > $L/torch_olmoe.log 2>&1; echo "torch rc=$?"
tail -1 $L/torch_olmoe.log | grep -o '"tokens_per_s": [0-9.]*'; pack
for c in 1300000000 auto 1300000000b; do
  [ $(el) -gt 400 ] && break
  if [ $c = auto ]; then unset SF_HOLD_GRADS; else export SF_HOLD_GRADS=${c%b}; fi
  t0=$(date +%s); timeout 100 $B bench --preset olmoe-1b-7b $O --gpu-memory 24GiB --optimizer-state bf16 > $L/olmoe_$c.json 2> $L/olmoe_$c.log; echo "olmoe_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady" $L/olmoe_$c.log | cut -c1-200; grep -o '"host_update_ms":[0-9.]*' $L/olmoe_$c.json; pack
done
unset SF_HOLD_GRADS
echo total $(el)s
