#!/bin/bash
# session 15 call 1: the GPU test suite on the binary that loads cuBLASLt on first use (dlopen);
# 3B all-host no clip: held-gradient sweep (auto, none, 1.0/1.4/2.0 G parameters) with traces
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; G=gpubin/sf_gpu_tests
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
/usr/bin/time -f "version %e s" $B --version
s t_all 200 $G --gtest_brief=1
grep -E "PASSED|FAILED|SKIPPED|Failure|tests ran" $L/t_all.log | head -12; pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1 --max-grad-norm 0"
for c in auto 0 1000000000 1400000000 2000000000; do
  [ $(el) -gt 480 ] && break
  if [ $c = auto ]; then unset SF_HOLD_GRADS; else export SF_HOLD_GRADS=$c; fi
  t0=$(date +%s); SF_TRACE=$L/tr3b_$c.jsonl timeout 70 $B bench --preset llama-3b $O --offload --gpu-blobs 0 > $L/h3b_$c.json 2> $L/h3b_$c.log; echo "h3b_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/h3b_$c.log | cut -c1-250; grep -o "\"hold_grads\":[0-9]*\|\"whole_layers\":[0-9]*" $L/h3b_$c.json | tr '\n' ' '; echo
  python3 tools/trace_summary.py $L/tr3b_$c.jsonl --layers > $L/tr3b_$c.txt 2>&1; sed -n 6,7p $L/tr3b_$c.txt | cut -c1-700
  pack
done
unset SF_HOLD_GRADS
echo total $(el)s
