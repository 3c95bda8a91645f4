#!/bin/bash
# session 12 call 3: h4's attention trial (no barrier between the backward's consumers; hd64 on TMA dQ + halves)
# against the shipped backward (hd128: TMA dQ, session 11's trial; hd64: atomics); the sliding engine against the
# resident one on CUDA for every family (Gemma 4 per-layer inputs among them) and kept activations with Gemma 4
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
s engines 120 gpubin/sf_gpu_tests --gtest_filter='CudaEngines.*:CudaSelectiveRecompute.*'
grep -E "PASSED|FAILED|OK \]|Failure|sliding vs|gemma4" $L/engines.log | head -40 | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs
t0=$(date +%s); OUT=$L/attn BIN=gpubin timeout 330 bash tools/gpu_check.sh attn_trial > /dev/null 2>&1; echo "attn_trial rc=$? $(( $(date +%s)-t0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/attn/all.log | head -8; grep -E "RESULT" $L/attn/summary.txt | cut -c1-160 | head -40
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(el)s
