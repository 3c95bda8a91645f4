#!/bin/bash
# session 22 call 4: the backward's shipped order (the heavier 3/4 of key tiles in supergroups of
# 64 MiB, the light quarter over the whole grid) alternated against HEAD at hd 128 / 64 / 256, long
# rows and packed rows; the whole GPU suite and attention beside torch on the new binary; the 8B
# longest-sequence run again for peak RSS against the plan (windowed set-up fills).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
ab() {  # $1 = log, $2 = rounds, rest = shape
  local log=$1 n=$2; shift 2
  for r in $(seq $n); do for v in prev new; do
    b=gpubin/attn_bench_$v; [ $v = new ] && b=gpubin/attn_bench
    echo "$v r$r $(timeout 60 $b "$@" 2>&1 | grep RESULT | sed 's/RESULT sf_attn path=auto//')" >> $L/$log
  done; done; cat $L/$log
}
ab ab_hd128.log 4 8 2048 32 8 128
ab ab_hd64.log 3 8 2048 32 8 64
ab ab_hd256.log 3 8 2048 8 4 256
ab ab_long.log 2 1 32768 32 8 128
ab ab_long.log 2 2 8192 32 8 64
ab ab_pack.log 2 8 2048 32 8 128 --pack 512
echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 150 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
timeout 100 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_flash|torch_cudnn|sf_attn path=auto|attn_hd)|parity.*(fail|FAIL)|attn_parity" $L/attn.log | head -30; pack
left=$(( 430 - $(date +%s) + T0 ))
timeout $left gpubin/slideformer bench --preset llama-8b --batch-size 1 --seq-len 54948 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --steps 2 --warmup 1 > $L/l8_long.log 2>&1
echo "l8 rc=$? at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/l8_long.log | tail -3; grep -o "\"tokens_per_second\":[0-9.]*\|\"predicted_tokens_per_second\":[0-9.]*\|\"step_ms\":[0-9.]*\|\"peak_rss_bytes\":[0-9]*\|\"predicted_host_bytes\":[0-9]*\|\"host_bytes\":[0-9]*\|\"setup_s\":[0-9.]*" $L/l8_long.log; pack
