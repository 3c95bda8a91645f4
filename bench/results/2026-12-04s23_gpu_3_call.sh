#!/bin/bash
# session 23 call 3: the shipping binary (the instruction trims + hd-64 dQ by TMA reduce-adds):
# the whole GPU suite, attention beside torch, transformers parity and the 100-step curve, 3B
# resident; the bounded kernels' spills (the shared-space base spills 16 / 60 bytes in the
# bounded forwards) against v3 (the forward on the generic base), alternated.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
ab() {  # $1 = log, $2 = rounds, rest = shape
  local log=$1 n=$2; shift 2
  for r in $(seq $n); do for v in new v3; do
    b=gpubin/attn_bench; [ $v = v3 ] && b=gpubin/v3/attn_bench
    echo "$v r$r $(timeout 60 $b "$@" 2>&1 | grep RESULT | sed 's/RESULT sf_attn path=auto//')" >> $L/$log
  done; done
}
ab ab_bounded.log 2 8 2048 32 8 128 --pack 512
ab ab_bounded.log 2 8 2048 8 4 256 --pack 512
ab ab_bounded.log 2 8 2048 8 4 256 --window 1024
ab ab_bounded.log 2 8 2048 32 8 64 --pack 512
cat $L/ab_bounded.log; echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 170 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
timeout 120 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_flash|torch_cudnn|attn_hd)|FAIL|attn_parity|  hd" $L/attn.log | head -40; pack
timeout 200 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"; tail -2 $L/parity_cuda.log; pack
timeout 80 python3 tools/hf_train_compare.py --bin gpubin/slideformer --device cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"; tail -2 $L/train_cuda.log; pack
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
timeout 100 $B bench --preset llama-3b $O --no-offload --steps 4 --warmup 1 > $L/b3_res.log 2>&1; echo "3b rc=$? at $(( $(date +%s)-T0 ))s"
grep -v "^{" $L/b3_res.log | tail -3; grep -o "\"tokens_per_second\":[0-9.]*\|\"step_ms\":[0-9.]*\|\"predicted_tokens_per_second\":[0-9.]*" $L/b3_res.log; pack
echo "done at $(( $(date +%s)-T0 ))s"
