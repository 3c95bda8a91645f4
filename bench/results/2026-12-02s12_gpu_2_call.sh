#!/bin/bash
# session 12 call 2: Gemma 4 through the sliding engine on cuda (gradients wrong in call 1): which part;
# OLMoE at 24 GiB with --profile-ops (where the plan's missing second goes); MoE parity through the sliding engine;
# the Qwen3-30B-A3B 4-layer cut against its plan; 8B K=8 NVMe with read-ahead (issue 17) if time remains
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
P="python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --no-baseline"
s g4_keep0 40 $P --models gemma4_dense_fp32 --cli-args "--offload --slots 2 --gpu-blobs 0 --keep-layers 0 --keep-attention 0" --work /tmp/g4a
grep -hE "passed, .* failed|max rel" $L/g4_keep0.log | head -3 | cut -c1-200
s g4_blobs5 40 $P --models gemma4_dense_fp32 --cli-args "--offload --slots 2 --gpu-blobs 5" --work /tmp/g4b
grep -hE "passed, .* failed|max rel" $L/g4_blobs5.log | head -3 | cut -c1-200
s g4_blobs5_keep0 40 $P --models gemma4_dense_fp32 --cli-args "--offload --slots 2 --gpu-blobs 5 --keep-layers 0 --keep-attention 0" --work /tmp/g4c
grep -hE "passed, .* failed|max rel" $L/g4_blobs5_keep0.log | head -3 | cut -c1-200
s g3_keep0 40 $P --models gemma3_hd256,llama_gqa_tied --cli-args "--offload --slots 2 --gpu-blobs 0 --keep-layers 0 --keep-attention 0" --work /tmp/g3a
grep -hE "passed, .* failed|max rel" $L/g3_keep0.log | head -3 | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs
r() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s $(grep -oE '"(tokens_per_second|step_ms|predicted_tokens_per_second|setup_s|host_update_ms|gpu_blobs|mfu)": *[0-9.]*' $L/$n.json | tr '\n' ' ')"; grep -h "^plan:" $L/$n.log | cut -c1-250 | head -6; }
r olmoe_profile 110 gpubin/slideformer bench --preset olmoe-1b-7b --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16 --profile-ops
tar czf $OUT/logs.tgz -C $OUT logs
t0=$(date +%s); OUT=$L/moe BIN=gpubin timeout 95 bash tools/gpu_check.sh moe_parity_offload > /dev/null 2>&1; echo "moe_parity_offload rc=$? $(( $(date +%s)-t0 ))s"
grep -hE "passed, .* failed|^FAIL" $L/moe/all.log | head -5 | cut -c1-200
r qwen3_4l 75 gpubin/slideformer bench --preset qwen3-30b-a3b --layers 4 --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB
tar czf $OUT/logs.tgz -C $OUT logs
left=$(( 580 - $(el) )); echo "nvme8_lend with ${left}s"
[ $left -gt 150 ] && { t0=$(date +%s); OUT=$L/nvme BIN=gpubin timeout $left bash tools/gpu_check.sh nvme8_lend > /dev/null 2>&1; echo "nvme8_lend rc=$? $(( $(date +%s)-t0 ))s"; grep -E "ok:|MISSING|tokens_per_second|^plan:|^bench:|phases" $L/nvme/all.log | cut -c1-300 | head -12; }
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(el)s
