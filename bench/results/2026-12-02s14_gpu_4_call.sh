#!/bin/bash
# session 14 call 4: the whole GPU test suite on the final binary (held gradients from the top by
# default); OLMoE at 24 GiB with 3 layers held against the planner's 5
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; G=gpubin/sf_gpu_tests
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
s t_all 200 $G --gtest_brief=1
grep -E "PASSED|FAILED|SKIPPED|Failure|tests ran" $L/t_all.log | head -12; pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1 --max-grad-norm 0"
for c in 1200000000 auto; do
  [ $(el) -gt 420 ] && break
  if [ $c = auto ]; then unset SF_HOLD_GRADS; else export SF_HOLD_GRADS=$c; fi
  t0=$(date +%s); SF_TRACE=$L/trolmoe_$c.jsonl timeout 100 $B bench --preset olmoe-1b-7b $O --gpu-memory 24GiB --optimizer-state bf16 > $L/olmoe_$c.json 2> $L/olmoe_$c.log; echo "olmoe_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/olmoe_$c.log | cut -c1-250
  python3 tools/trace_summary.py $L/trolmoe_$c.jsonl > $L/trolmoe_$c.txt 2>&1; cut -c1-90 $L/trolmoe_$c.txt
  pack
done
echo total $(el)s
