#!/bin/bash
# session 12 call 4: h2's MoE grouped GEMMs on cuBLASLt per expert: MoE gtests, moe_gemm_bench (lt / lt1 / tiles),
# OLMoE at 24 GiB with --profile-ops, the Qwen3-30B-A3B 4-layer cut (each beside its plan)
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
t0=$(date +%s); OUT=$L/moe BIN=gpubin timeout 420 bash tools/gpu_check.sh moe_gemm > /dev/null 2>&1; echo "moe_gemm rc=$? $(( $(date +%s)-t0 ))s"
grep -E "PASSED|FAILED|Failure" $L/moe/all.log | head -10 | cut -c1-200
grep -E "^RESULT|MISMATCH" $L/moe/all.log | cut -c1-220 | head -40
grep -E "tokens_per_second|plan|vs plan|^bench:" $L/moe/summary.txt | cut -c1-250 | head -12
grep -hE "^bench:" $L/moe/all.log | cut -c1-200 | head -8
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(( $(date +%s)-T0 ))s
