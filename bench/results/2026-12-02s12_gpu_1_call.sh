#!/bin/bash
# session 12 call 1: h4's sm_90 backward trial (attn_bwd2) vs the shipped one; parity through the sliding engine
# on the persistent forward (never ran); Gemma 4 per-layer inputs against transformers (cpu and cuda)
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
t0=$(date +%s); OUT=$L/attn timeout 200 bash tools/gpu_check.sh attn_bwd2 > /dev/null 2>&1; echo "attn_bwd2 rc=$? $(( $(date +%s)-t0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/attn/all.log | head -8; grep -E "RESULT" $L/attn/summary.txt | cut -c1-160 | head -40
tar czf $OUT/logs.tgz -C $OUT logs
s parity_offload $(( 420 - $(el) )) python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --cli-args "--offload --slots 2 --gpu-blobs 0" --no-baseline --work /tmp/parity_offload
grep -hE "passed, .* failed|^FAIL" $L/parity_offload.log | head -8 | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs
left=$(( 570 - $(el) )); echo "gemma4 with ${left}s"
[ $left -gt 40 ] && s g4_ple_cuda $left python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --models gemma4_ple --work /tmp/g4_cuda
grep -hE "passed, .* failed|^FAIL" $L/g4_ple_cuda.log | head -8 | cut -c1-200
left=$(( 590 - $(el) ))
[ $left -gt 15 ] && s g4_ple_cpu $left python3 tools/hf_parity.py --bin gpubin/slideformer --device cpu --models gemma4_ple --work /tmp/g4_cpu
grep -hE "passed, .* failed|^FAIL" $L/g4_ple_cpu.log | head -8 | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(el)s
