#!/bin/bash
# session 12 call 5 (last): h4's packed rows (attention gtests first), the merged code's other GPU tests (MoE
# cuBLASLt only, engines, Gemma 4, ...), h1's NVMe store changes on the 8B K=8 run with its verdict
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
t0=$(date +%s); OUT=$L/attn BIN=gpubin timeout 200 bash tools/gpu_check.sh attn_packed > /dev/null 2>&1; echo "attn_packed rc=$? $(( $(date +%s)-t0 ))s"
grep -E "PASSED|FAILED|SKIPPED|Failure" $L/attn/all.log | head -8; grep -E "RESULT" $L/attn/summary.txt | cut -c1-170 | head -40
tar czf $OUT/logs.tgz -C $OUT logs
s gpu_tests 100 gpubin/sf_gpu_tests --gtest_brief=1 --gtest_filter='-CudaOps.Attention*'
grep -E "PASSED|FAILED|SKIPPED|Failure" $L/gpu_tests.log | head -12
tar czf $OUT/logs.tgz -C $OUT logs
left=$(( 500 - $(el) )); echo "nvme8_lend with ${left}s"
[ $left -gt 120 ] && { t0=$(date +%s); OUT=$L/nvme BIN=gpubin timeout $left bash tools/gpu_check.sh nvme8_lend > /dev/null 2>&1; echo "nvme8_lend rc=$? $(( $(date +%s)-t0 ))s"; grep -E "ok:|MISSING|^bench:" $L/nvme/all.log | cut -c1-250 | head -8; sed -n '/===== nvme8_lend_verdict/,$p' $L/nvme/all.log | head -30 | cut -c1-250; }
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(el)s
