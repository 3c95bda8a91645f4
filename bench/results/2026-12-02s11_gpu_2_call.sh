#!/bin/bash
# session 11 call 2: h4's persistent sm_90 forward vs the shipped one (tests, attn_bench, torch backends);
# 3B all-host no-clip and 24 GiB clip 1 with and without kept activations (the sliding default);
# 8B K=8 NVMe with the read-ahead into freed checkpoints (h1) against its plan
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
t0=$(date +%s); OUT=$L/attn timeout 280 bash tools/gpu_check.sh attn_v2 > /dev/null 2>&1; echo "attn_v2 rc=$? $(( $(date +%s)-t0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/attn/all.log | head -8; grep -E "RESULT" $L/attn/summary.txt | cut -c1-200 | head -40
tar czf $OUT/logs.tgz -C $OUT logs
r() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s $(grep -oE '"(tokens_per_second|step_ms|predicted_tokens_per_second|whole_layers|kept_layers|host_update_ms|gpu_blobs|device_bytes)": *[0-9.]*' $L/$n.json | tr '\n' ' ')"; grep -h "^plan:" $L/$n.log | cut -c1-250; }
H="--preset llama-3b --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda"
for k in 0 -1; do r host_clip0_keep$k 60 gpubin/slideformer bench $H --offload --gpu-blobs 0 --max-grad-norm 0 --keep-layers $k --keep-attention $k; done
for k in 0 -1; do r g24_clip1_keep$k 60 gpubin/slideformer bench $H --gpu-memory 24GiB --max-grad-norm 1 --keep-layers $k --keep-attention $k; done
tar czf $OUT/logs.tgz -C $OUT logs
left=$(( 575 - ($(date +%s)-T0) ))
echo "nvme8_lend with ${left}s"
[ $left -gt 120 ] && { t0=$(date +%s); OUT=$L/nvme timeout $left bash tools/gpu_check.sh nvme8_lend > /dev/null 2>&1; echo "nvme8_lend rc=$? $(( $(date +%s)-t0 ))s"; grep -E "ok:|MISSING|tokens_per_second|^plan:|^bench:|phases" $L/nvme/all.log | cut -c1-300 | head -20; }
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(( $(date +%s)-T0 ))s
