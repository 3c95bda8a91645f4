#!/bin/bash
# session 19 call 6: call 5 again after the dS^T swizzle fix for rows of 32 (the hd-256 backward's
# query tiles of 32 had written past their rows: dQ NaN). Tests, parity and timing, Gemma 3 4B.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
timeout 120 gpubin/sf_gpu_tests --gtest_filter='CudaOps.Attention*:CudaOpsCheck*' --gtest_brief=1 > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/t_attn.log | head -10
timeout 120 python3 bench/attn_vs_torch.py gpubin --head-dims 256 --shapes 8,2048,8,4 > $L/attn_new.log 2>&1; echo "new rc=$?"
grep -E "RESULT attn|hd 256|parity" $L/attn_new.log | head -20
O="--batch-size 8 --seq-len 2048 --device cuda --steps 3 --warmup 1 --max-grad-norm 1"
timeout 80 gpubin/slideformer bench --preset gemma3-4b $O > $L/g3_new.json 2> $L/g3_new.log; echo "g3_new rc=$?"
grep -E "bench:.*steady" $L/g3_new.log | cut -c1-200
echo "at $(( $(date +%s)-T0 ))s"
