#!/bin/bash
# session 11 call 4 (~250 s): the refusal test at the new head-dim limit, parity of every family on the shipped
# persistent forward (make_tiny_models fixed for Gemma 4's per-layer config values), then Gemma 4 parity
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
s gpu_tests_some 40 gpubin/sf_gpu_tests --gtest_brief=1 --gtest_filter='CudaOpsCheck.*:CudaOps.AttentionHeadDim512*:CudaOps.LinearCrossEntropy*'
grep -E "PASSED|FAILED|SKIPPED" $L/gpu_tests_some.log | head -8
M=llama_gqa_tied,llama3rope_mha_bias,mistral_gqa,qwen2_bias_tied,qwen3_qknorm,qwen3_qknorm_tied,gemma3_hd256,gemma3_small,qwen3moe_aux,qwen3moe_noaux,mixtral_aux,olmoe_noaux,olmoe_aux,qwen3moe_fused,mixtral_fused_aux
s parity_cuda 165 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --models $M --work /tmp/parity_cuda
grep -hE "passed, .* failed|^FAIL" $L/parity_cuda.log | head -8 | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs
s parity_gemma4 $(( 250 - $(el) )) python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --models gemma4_dense,gemma4_kvshared --work /tmp/parity_g4
grep -hE "passed, .* failed|^FAIL|Error" $L/parity_gemma4.log | head -8 | cut -c1-250
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(el)s
