#!/bin/bash
# session 24 call 6: the forward consumers issue a tile's first QK^T before the tile's own set-up
# (new) against the shipped cc8f0c9 kernels (prev), alternated; the attention tests, attention
# beside torch and transformers parity on new.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
ab() {  # $1 = log, $2 = rounds, rest = shape
  local log=$1 n=$2; shift 2
  for r in $(seq $n); do for v in prev new; do
    b=gpubin/attn_bench; [ $v = prev ] && b=gpubin/prev/attn_bench
    echo "$v r$r $(timeout 60 $b "$@" 2>&1 | grep RESULT | sed 's/RESULT sf_attn path=auto//')" >> $L/$log
  done; done
}
for hd in 64 128; do
  ab ab.log 3 8 2048 32 8 $hd --pack 512
  ab ab.log 3 32 512 32 8 $hd
  ab ab.log 2 8 2048 32 8 $hd
done
ab ab.log 2 8 2048 8 4 256
ab ab.log 2 8 2048 8 4 256 --window 1024
cat $L/ab.log; echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 150 gpubin/sf_gpu_tests --gtest_brief=1 --gtest_filter='*Attention*:*Attn*:CudaOpsCheck*:CudaPack*' > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_attn.log | head -20; pack
timeout 120 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "attn_parity|ratio|packed_per_token" $L/attn.log | head -20; pack
timeout 200 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"; tail -1 $L/parity_cuda.log; pack
echo "done at $(( $(date +%s)-T0 ))s"
