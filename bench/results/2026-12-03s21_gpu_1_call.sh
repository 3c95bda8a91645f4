#!/bin/bash
# session 21 call 1: the new attention kernels (forward: the first consumer's diagonal tile in
# half; backward: the second consumer skips its all-masked first tile, dQ over half the keys
# there) -- the whole GPU test suite (also CudaOps.IdsOrZero, not yet run on a GPU), then the
# three binaries alternated (old = session 20's, fwd = the forward change alone, both), then
# torch SDPA's backends and parity in the same call.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > $L/smi.log 2>&1
timeout 200 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
for hd in 128 64; do
  for r in 1 2 3; do
    for v in old fwd both; do
      b=gpubin/attn_bench_$v; [ $v = both ] && b=gpubin/attn_bench
      echo "$v r$r $(timeout 60 $b 8 2048 32 8 $hd 2>&1 | grep RESULT)" >> $L/ab_hd$hd.log
    done
  done
  grep -o "^[a-z]* r[0-9].*fwd_ms.*" $L/ab_hd$hd.log | sed 's/path=auto B=8 T=2048 H=32 KVH=8//'
done
echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 150 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_flash|torch_cudnn|sf_attn path=auto)|parity" $L/attn.log | head -20; pack
# 8B at 24 GiB: the longest sequence the planner says fits (host memory decides), trained
LS=$(gpubin/slideformer plan --preset llama-8b --batch-size 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --longest-seq 2>&1 | tee $L/l8_plan.log | grep -o "longest sequence that fits: [0-9]*" | grep -o "[0-9]*$")
echo "longest $LS at $(( $(date +%s)-T0 ))s"; left=$(( 590 - $(date +%s) + T0 ))
[ -n "$LS" ] && timeout $left gpubin/slideformer bench --preset llama-8b --batch-size 1 --seq-len $LS --device cuda --gpu-memory 24GiB --max-grad-norm 1 --steps 2 --warmup 1 > $L/l8_long.log 2>&1
echo "l8 rc=$? at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/l8_long.log | tail -4; grep -o "\"tokens_per_second\":[0-9.]*\|\"predicted_tokens_per_second\":[0-9.]*\|\"step_ms\":[0-9.]*" $L/l8_long.log; pack
