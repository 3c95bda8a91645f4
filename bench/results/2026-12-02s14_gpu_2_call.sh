#!/bin/bash
# session 14 call 2: compute-sanitizer on the attention/pack kernels (h2's bounded sm_90 rework);
# SF_TRACE timelines of the no-clip offload step with and without held gradients (3B all-host,
# OLMoE at 24 GiB) to find why holding lost in session 13
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; G=gpubin/sf_gpu_tests
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
echo "compute-sanitizer: $CS"
if [ -n "$CS" ]; then
  t0=$(date +%s); timeout 170 $CS --tool memcheck --error-exitcode 9 $G --gtest_brief=1 --gtest_filter='CudaOps.Attention*:CudaPack*' > $L/sanitizer_attn.log 2>&1; echo "sanitizer_attn rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "PASSED|FAILED|ERROR SUMMARY|Invalid|out of bounds" $L/sanitizer_attn.log | sort | uniq -c | head -12
fi
pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1 --max-grad-norm 0"
for c in "0" "1" "800000000"; do
  [ $(el) -gt 330 ] && break
  t0=$(date +%s); SF_TRACE=$L/tr3b_$c.jsonl SF_HOLD_GRADS=$c timeout 60 $B bench --preset llama-3b $O --offload --gpu-blobs 0 > $L/h3b_$c.json 2> $L/h3b_$c.log; echo "h3b_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep "bench:.*steady" $L/h3b_$c.log; grep "hold\|held" $L/h3b_$c.log | head -3
  python3 tools/trace_summary.py $L/tr3b_$c.jsonl > $L/tr3b_$c.txt 2>&1; cat $L/tr3b_$c.txt
  pack
done
for c in "0" "1"; do
  [ $(el) -gt 440 ] && break
  t0=$(date +%s); SF_TRACE=$L/trolmoe_$c.jsonl SF_HOLD_GRADS=$c timeout 110 $B bench --preset olmoe-1b-7b $O --gpu-memory 24GiB --optimizer-state bf16 > $L/holmoe_$c.json 2> $L/holmoe_$c.log; echo "holmoe_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep "bench:.*steady" $L/holmoe_$c.log; grep "hold\|held" $L/holmoe_$c.log | head -3
  python3 tools/trace_summary.py $L/trolmoe_$c.jsonl > $L/trolmoe_$c.txt 2>&1; cat $L/trolmoe_$c.txt
  pack
done
echo total $(el)s
