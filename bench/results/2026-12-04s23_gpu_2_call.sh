#!/bin/bash
# session 23 call 2: the instruction trims (shared-space pointers, descriptors moved by constants,
# counted tile walk, mask pass on diagonal tiles only, softmax scale out of dS) = v1, and v1 + the
# hd-64 dQ through TMA reduce-adds = v2, alternated with HEAD (prev); parity beside torch; the GPU
# attention tests on v2; ncu SourceCounters of v2's hd-64 backward.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
ab() {  # $1 = log, $2 = rounds, $3 = variants, rest = shape
  local log=$1 n=$2 vs=$3; shift 3
  for r in $(seq $n); do for v in $vs; do
    echo "$v r$r $(timeout 60 gpubin/$v/attn_bench "$@" 2>&1 | grep RESULT | sed 's/RESULT sf_attn path=auto//')" >> $L/$log
  done; done; cat $L/$log
}
ab ab_hd64.log 4 "prev v1 v2" 8 2048 32 8 64
ab ab_hd128.log 3 "prev v1" 8 2048 32 8 128
ab ab_hd256.log 2 "prev v1" 8 2048 8 4 256
ab ab_pack.log 2 "prev v2" 8 2048 32 8 128 --pack 512
ab ab_pack.log 2 "prev v2" 8 2048 32 8 64 --pack 512
echo "ab at $(( $(date +%s)-T0 ))s"; pack
for v in v1 v2; do
  timeout 90 python3 bench/attn_vs_torch.py gpubin/$v --head-dims 128,64 --shapes 2,512,8,2 > $L/parity_$v.log 2>&1
  echo "parity $v rc=$? at $(( $(date +%s)-T0 ))s"; grep -E "FAIL|attn_parity" $L/parity_$v.log
done; pack
timeout 150 gpubin/sf_gpu_tests --gtest_brief=1 --gtest_filter='*Attention*:*Attn*:CudaOpsCheck*' > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_attn.log | head -20; pack
N="--clock-control none --section SourceCounters --section InstructionStats --section WarpStateStats --section SchedulerStats --section SpeedOfLight"
timeout 100 ncu $N --kernel-name regex:flash_bwd_sm90 --launch-skip 1 --launch-count 1 -o $L/v2_64 gpubin/v2/attn_bench 8 2048 32 8 64 > $L/ncu_v2_64.log 2>&1
echo "ncu rc=$? at $(( $(date +%s)-T0 ))s"
ncu -i $L/v2_64.ncu-rep --page source --csv --print-source sass > $L/v2_64_source.csv 2>&1
ncu -i $L/v2_64.ncu-rep --page details > $L/v2_64_details.txt 2>&1
xz $L/v2_64_source.csv; rm -f $L/*.ncu-rep; pack
echo "done at $(( $(date +%s)-T0 ))s"
