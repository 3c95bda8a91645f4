#!/bin/bash
# session 10 call 1: h6's workspace carve (default paths) + selective recompute on the GPU, torch compiled beside, MoE parity, NVMe 8B
tar xJf gpupack/bin.tar.xz
G="OUT=$OUT/gc BIN=gpubin"
step() { local t=$1; shift; local t0=$(date +%s); OUT=$OUT/gc BIN=gpubin timeout $t bash tools/gpu_check.sh "$@" > /dev/null 2>&1; echo "$* rc=$? $(( $(date +%s)-t0 ))s"; }
step 90 gpu_tests; grep -E "PASSED|FAILED|SKIPPED" $OUT/gc/all.log | head -20
step 70 parity_cuda
step 50 parity_offload
grep -E "^(PASS|FAIL)|all .* pass|failed" $OUT/gc/all.log | tail -8
O="--batch-size 8 --seq-len 2048 --device cuda --no-offload"
r() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $OUT/$n.json 2> $OUT/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s $(grep -o "\"tokens_per_second\": *[0-9.]*" $OUT/$n.json | head -1)"; grep -h "^plan:" $OUT/$n.log | head -1; }
timeout 60 gpubin/sf_gpu_tests --gtest_filter='CudaSelectiveRecompute*' --gtest_brief=1 2>&1 | tail -4
r sf3b_keep_none 70 gpubin/slideformer bench --preset llama-3b $O --steps 4 --warmup 1 --keep-layers 0 --keep-attention 0
r sf3b_keep_planner 70 gpubin/slideformer bench --preset llama-3b $O --steps 4 --warmup 1 --keep-layers -1 --keep-attention -1
r sf3b_keep_attn 70 gpubin/slideformer bench --preset llama-3b $O --steps 4 --warmup 1 --keep-layers 0 --keep-attention -1
r torch3b_compiled 120 python3 bench/torch_train_baseline.py --preset 3b --compile --steps 3 --warmup 1
r sf3b_keep_planner2 70 gpubin/slideformer bench --preset llama-3b $O --steps 4 --warmup 1 --keep-layers -1 --keep-attention -1
r sf1b_keep_none 40 gpubin/slideformer bench --preset llama-1b $O --steps 6 --warmup 2 --keep-layers 0 --keep-attention 0
r sf1b_keep_planner 40 gpubin/slideformer bench --preset llama-1b $O --steps 6 --warmup 2 --keep-layers -1 --keep-attention -1
r torch1b_compiled 90 python3 bench/torch_train_baseline.py --preset 1b --compile --steps 3 --warmup 1
tail -3 $OUT/torch3b_compiled.log $OUT/torch1b_compiled.log | cut -c1-300
