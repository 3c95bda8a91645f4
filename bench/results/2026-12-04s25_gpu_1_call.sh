#!/bin/bash
# session 25 call 1: forward variants alternated (prev = HEAD cc8f0c9's kernels, new = + the bounded
# kernels' first QK^T before the tile set-up, late = new + the O store's Q-buffer release under the
# next tile's first QK^T); the GPU suite whole on new and on late; attention beside torch on both.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
ab() {  # $1 = log, $2 = rounds, $3 = variants, rest = shape
  local log=$1 n=$2 vs=$3; shift 3
  for r in $(seq $n); do for v in $vs; do
    b=gpubin/attn_bench; [ $v != new ] && b=gpubin/$v/attn_bench
    echo "$v r$r $* $(timeout 60 $b "$@" 2>&1 | grep RESULT | sed 's/RESULT sf_attn path=auto//')" >> $L/$log
  done; done
}
for hd in 64 128; do
  ab ab.log 3 "prev new late" 8 2048 32 8 $hd --pack 512
  ab ab.log 2 "prev new late" 32 512 32 8 $hd
  ab ab.log 2 "prev new late" 8 2048 32 8 $hd
done
ab ab.log 2 "prev new" 8 2048 8 4 256 --window 1024
cat $L/ab.log; echo "ab at $(( $(date +%s)-T0 ))s"; pack
for v in new late; do
  b=gpubin/sf_gpu_tests; [ $v = late ] && b=gpubin/late/sf_gpu_tests
  timeout 200 $b --gtest_brief=1 > $L/t_all_$v.log 2>&1; echo "tests $v rc=$? at $(( $(date +%s)-T0 ))s"
  grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all_$v.log | head -20; pack
done
for v in new late; do
  d=gpubin; [ $v = late ] && d=gpubin/late
  [ $v = late ] && cp gpubin/bench_adamw gpubin/late/ 2>/dev/null
  timeout 100 python3 bench/attn_vs_torch.py $d --head-dims 128,64 > $L/attn_$v.log 2>&1; echo "attn $v rc=$? at $(( $(date +%s)-T0 ))s"
  grep -E "attn_parity|ratio|packed_per_token" $L/attn_$v.log | head -20; pack
done
echo "done at $(( $(date +%s)-T0 ))s"
