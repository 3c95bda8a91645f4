#!/bin/bash
# session 13 call 1: the merged code's GPU tests (session 12's unrun clean-ups), Gemma 4 against
# transformers, Gemma 3 4B beside PyTorch, 13B on the NVMe tier (issue 17 re-timing)
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
s gpu_tests 110 gpubin/sf_gpu_tests --gtest_brief=1
grep -E "PASSED|FAILED|SKIPPED|Failure|error" $L/gpu_tests.log | head -14; pack
t0=$(date +%s); OUT=$L/g4 BIN=gpubin timeout 210 bash tools/gpu_check.sh gemma4 > /dev/null 2>&1; echo "gemma4 rc=$? $(( $(date +%s)-t0 ))s"
cat $L/g4/summary.txt; grep -E "passed|failed|FAIL|worst|Error" $L/g4/all.log | cut -c1-200 | head -30; pack
left=$(( 560 - $(el) )); echo "gemma3_speed with ${left}s"
[ $left -gt 150 ] && { t0=$(date +%s); OUT=$L/g3 BIN=gpubin timeout $left bash tools/gpu_check.sh gemma3_speed > /dev/null 2>&1; echo "gemma3_speed rc=$? $(( $(date +%s)-t0 ))s"; cat $L/g3/summary.txt | cut -c1-300; tail -1 $L/g3/gemma3_4b_torch.log 2>/dev/null; grep -h "tokens_per_s" $L/g3/all.log | tail -2 | cut -c1-400; }
pack
left=$(( 570 - $(el) )); echo "nvme13 with ${left}s"
[ $left -gt 100 ] && { t0=$(date +%s); OUT=$L/n13 BIN=gpubin timeout $left bash tools/gpu_check.sh nvme13 > /dev/null 2>&1; echo "nvme13 rc=$? $(( $(date +%s)-t0 ))s"; cat $L/n13/summary.txt; grep -E "predicted|tokens" $L/n13/all.log | cut -c1-300 | tail -5; }
pack
echo total $(el)s
