#!/bin/bash
# session 19 call 5: the hd-256 attention backward in query tiles of 32, one stage (two blocks an
# SM) against tiles of 64 in two stages (one block an SM). The attention GPU tests (CPU twin) on
# the new code; attn_vs_torch at hd 256 (Gemma 3 4B's heads) for new (with parity) and old; then
# Gemma 3 4B resident, clip 1, new and old binaries (old: session 18's).
mkdir -p old old2 && tar xJf gpupack/old.tar.xz -C old && tar xJf gpupack/attn.tar.xz -C old2 && tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
timeout 200 gpubin/sf_gpu_tests --gtest_filter='CudaOps.Attention*:CudaOpsCheck*' --gtest_brief=1 > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/t_attn.log | head -10
timeout 150 python3 bench/attn_vs_torch.py gpubin --head-dims 256 --shapes 8,2048,8,4 > $L/attn_new.log 2>&1; echo "new rc=$?"
grep -E "RESULT attn|hd 256|parity.*FAIL" $L/attn_new.log | head -12
timeout 100 python3 bench/attn_vs_torch.py old2/gpubin --head-dims 256 --shapes 8,2048,8,4 --no-parity > $L/attn_old.log 2>&1; echo "old rc=$?"
grep -E "hd 256 sf_auto|RESULT attn_hd256_ratio_vs_flash" $L/attn_old.log
echo "at $(( $(date +%s)-T0 ))s"
O="--batch-size 8 --seq-len 2048 --device cuda --steps 3 --warmup 1 --max-grad-norm 1"
for n in new old; do b=gpubin/slideformer; [ $n = old ] && b=old/gpubin/slideformer
  timeout 100 $b bench --preset gemma3-4b $O > $L/g3_$n.json 2> $L/g3_$n.log; echo "g3_$n rc=$?"
  grep -E "bench:.*steady" $L/g3_$n.log | cut -c1-200; done
echo "at $(( $(date +%s)-T0 ))s"
