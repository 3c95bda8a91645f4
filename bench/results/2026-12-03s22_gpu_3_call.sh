#!/bin/bash
# session 22 call 3: the backward's block order swept (experiment binary: key tiles jt < cut in
# supergroups of sg groups, heaviest first within, the rest over the whole grid), hd 128 / 64 / 256;
# the attention tests under odd orders; transformers parity and the 100-step curve on HEAD's binary.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/attn_bench_exp
sweep() {  # $1 = shape args, $2 = log, rest = "sg:cut8" configs
  local shape=$1 log=$2; shift 2
  for r in 1 2; do for c in "$@"; do
    sg=${c%%:*}; cut=${c##*:}
    echo "sg=$sg cut8=$cut r$r $(SF_EXP_BWD_SG=$sg SF_EXP_BWD_CUT8=$cut timeout 30 $B $shape 2>&1 | grep RESULT | sed 's/.*hd=//; s/pack=0 window=0//')" >> $L/$log
  done; done
  sort -s -k1,2 $L/$log
}
CF="999:8 16:8 8:8 4:8 2:8 1:8 8:4 4:4 2:4 1:4 8:6 4:6 2:6 1:6 4:2 999:8"
sweep "8 2048 32 8 128" sweep128.log $CF; echo "hd128 at $(( $(date +%s)-T0 ))s"; pack
sweep "8 2048 32 8 64" sweep64.log $CF; echo "hd64 at $(( $(date +%s)-T0 ))s"; pack
sweep "8 2048 8 4 256" sweep256.log 999:8 8:8 4:8 2:8 4:4 2:4 4:6 2:6 999:8; echo "hd256 at $(( $(date +%s)-T0 ))s"; pack
for c in 3:5 1:3; do
  SF_EXP_BWD_SG=${c%%:*} SF_EXP_BWD_CUT8=${c##*:} timeout 80 gpubin/sf_gpu_tests_exp --gtest_brief=1 --gtest_filter='CudaOps.Attention*' > $L/t_exp_$c.log 2>&1; echo "exp tests $c rc=$? at $(( $(date +%s)-T0 ))s"
  grep -E "PASSED|FAILED|SKIPPED" $L/t_exp_$c.log | head -5
done; pack
timeout 240 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "passed|failed" $L/parity_cuda.log | tail -3; pack
left=$(( 585 - $(date +%s) + T0 ))
timeout $left python3 tools/hf_train_compare.py --bin gpubin/slideformer --device cuda --work /tmp/train_cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "passed|failed" $L/train_cuda.log | tail -3; pack
