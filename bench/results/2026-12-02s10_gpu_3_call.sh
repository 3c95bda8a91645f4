#!/bin/bash
# session 10 call 3 (final, ~530 s): merged code's GPU tests and parity (both engines, in parallel), then
# 3B 24 GiB with attention kept (sliding), 8B 1x32768 vs plan (long context), 8B K=8 NVMe vs plan
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
t0=$(date +%s)
timeout 120 gpubin/sf_gpu_tests --gtest_brief=1 > $L/gpu_tests.log 2>&1 & p1=$!
timeout 125 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda > $L/parity_cuda.log 2>&1 & p2=$!
timeout 125 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --cli-args "--offload --slots 2 --gpu-blobs 0" --work /tmp/parity_offload > $L/parity_offload.log 2>&1 & p3=$!
wait $p1; echo "gpu_tests rc=$?"; wait $p2; echo "parity_cuda rc=$?"; wait $p3; echo "parity_offload rc=$? $(( $(date +%s)-t0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/gpu_tests.log | head -12
grep -hE "passed, .* failed|FAIL" $L/parity_cuda.log $L/parity_offload.log | head -12 | cut -c1-200
r() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; grep -h "^plan:\|^predicted\|^phases\|^bench:" $L/$n.log | cut -c1-330; python3 -c "
import json,sys
try:
  d=json.loads([l for l in open(sys.argv[1]) if l.startswith('{')][-1])
  print({k:d.get(k) for k in ('tokens_per_second','predicted_tokens_per_second','step_ms','predicted_step_ms','predicted_phases','whole_layers','kept_layers','gpu_blobs','device_bytes','disk_read_bytes_per_step','disk_written_bytes_per_step','disk_busy_ms','predicted_disk_ms','host_update_ms','first_loss','loss','peak_rss_bytes')})
except Exception as e: print('no json', e)" $L/$n.json; }
O3="--preset llama-3b --batch-size 8 --seq-len 2048 --device cuda --gpu-memory 24GiB --max-grad-norm 1"
r sf3b_24g_keep_attn28 70 gpubin/slideformer bench $O3 --steps 3 --warmup 1 --keep-layers 0 --keep-attention 28
r long_8b_32k 140 gpubin/slideformer bench --preset llama-8b --batch-size 1 --seq-len 32768 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --steps 2 --warmup 0
mkdir -p /tmp/sf_off
r nvme_8b_k8_bf16 215 gpubin/slideformer bench --preset llama-8b --batch-size 8 --seq-len 2048 --steps 2 --warmup 0 --device cuda --gpu-memory 24GiB --cpu-memory 64GiB --offload-dir /tmp/sf_off --max-grad-norm 1 --grad-accum 8 --optimizer-state bf16
tar czf $OUT/logs.tgz -C $OUT logs
