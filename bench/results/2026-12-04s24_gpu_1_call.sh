#!/bin/bash
# session 24 call 1: the packed forward's gap. Variants of attention_sm90.cu (attn_bench only):
# base (HEAD 9771472), tmao (O through shared memory by TMA stores, the candidate), poslate (the
# producer's record starts after its first copies), order (experiment: packed tiles by true length,
# records of 512 only), both (poslate + order), tp (tmao + poslate); alternated, 2 rounds; then
# the candidate's attention GPU tests and 3B resident bench (the MFU fields).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
ab() {  # $1 = log, $2 = rounds, rest = shape
  local log=$1 n=$2; shift 2
  for r in $(seq $n); do for v in base tmao poslate order both tp; do
    echo "$v r$r $(timeout 60 gpubin/$v/attn_bench "$@" 2>&1 | grep RESULT | sed 's/RESULT sf_attn path=auto//')" >> $L/$log
  done; done
}
for hd in 64 128; do
  ab ab_$hd.log 2 8 2048 32 8 $hd --pack 512
  ab ab_$hd.log 2 32 512 32 8 $hd
  ab ab_$hd.log 2 32 512 32 8 $hd --pack 512
  echo "ab $hd at $(( $(date +%s)-T0 ))s"; pack
done
cat $L/ab_64.log $L/ab_128.log
timeout 150 gpubin/sf_gpu_tests --gtest_brief=1 --gtest_filter='*Attention*:*Attn*:CudaOpsCheck*' > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_attn.log | head -20; pack
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
timeout 100 $B bench --preset llama-3b $O --no-offload --steps 4 --warmup 1 > $L/b3_res.log 2>&1; echo "3b rc=$? at $(( $(date +%s)-T0 ))s"
grep -v "^{" $L/b3_res.log | tail -4; grep -o "\"tokens_per_second\":[0-9.]*\|\"step_ms\":[0-9.]*\|\"mfu_8n_of_gemm_peak\":[0-9.]*\|\"executed_of_gemm_peak\":[0-9.]*" $L/b3_res.log; pack
echo "done at $(( $(date +%s)-T0 ))s"
