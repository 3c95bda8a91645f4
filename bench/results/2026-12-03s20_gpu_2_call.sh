#!/bin/bash
# session 20 call 2: the sm_90 hd-256 attention backward (64-key blocks, columns split between the
# consumers, P^T / dS^T through shared memory): attention tests, parity and timing against torch
# (auto = the new backward, sm80 = the old kernels, same call); then call 1's runs (Qwen3-30B-A3B
# 4-layer cut vs plan, Gemma 3 4B at 24 GiB).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
timeout 200 gpubin/sf_gpu_tests --gtest_filter='CudaOps.Attention*:CudaOpsCheck*' --gtest_brief=1 > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|Failure|error" $L/t_attn.log | head -20; pack
timeout 150 python3 bench/attn_vs_torch.py gpubin --head-dims 256 --shapes 8,2048,8,4 > $L/attn256.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT|parity|Error|error" $L/attn256.log | head -30; tail -15 $L/attn256.log; pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
run() { local n=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout $t gpubin/slideformer bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:|predicted" $L/$n.log | cut -c1-300
  python3 -c "import json; j=json.load(open('$L/$n.json')); print({k: j[k] for k in j if k in ('tokens_per_s','predicted_tokens_per_s','host_update_ms','step_ms','uploads_per_step','pinned_bytes','host_rss_bytes','device_peak_bytes')})" 2>/dev/null
  pack; }
run g1 150 --preset gemma3-4b --gpu-memory 24GiB --max-grad-norm 1
run g2 150 --preset gemma3-4b --max-grad-norm 1
run q1 150 --preset qwen3-30b-a3b --layers 4 --gpu-memory 24GiB --max-grad-norm 1
run q2 150 --preset qwen3-30b-a3b --layers 4 --gpu-memory 24GiB --max-grad-norm 1
echo "at $(( $(date +%s)-T0 ))s"
