#!/bin/bash
# session 21 call 4: the work order of the sm_90 attention kernels in supergroups of kv heads
# (L2 locality), alternated against the previous binary; torch SDPA and parity; ncu's L2 view;
# then the whole GPU test suite.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
for hd in 128 64; do for r in 1 2 3 4; do for v in prev new; do
  b=gpubin/attn_bench_$v; [ $v = new ] && b=gpubin/attn_bench
  echo "$v r$r $(timeout 60 $b 8 2048 32 8 $hd 2>&1 | grep RESULT)" >> $L/ab_hd$hd.log
done; done; sed 's/RESULT sf_attn path=auto B=8 T=2048 H=32 KVH=8//; s/pack=0 window=0//' $L/ab_hd$hd.log; done
for r in 1 2; do for v in prev new; do
  b=gpubin/attn_bench_$v; [ $v = new ] && b=gpubin/attn_bench
  echo "$v r$r $(timeout 60 $b 8 2048 8 4 256 2>&1 | grep RESULT)" >> $L/ab_hd256.log
done; done; sed 's/RESULT sf_attn path=auto B=8 T=2048//; s/pack=0 window=0//' $L/ab_hd256.log
echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 90 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_cudnn|sf_attn path=auto|attn_hd)|parity.*(fail|FAIL)|attn_parity" $L/attn.log | head -20; pack
S="--section SpeedOfLight --section MemoryWorkloadAnalysis"
timeout 40 ncu --clock-control none --kernel-name regex:flash_fwd_sm90 --launch-skip 3 --launch-count 1 $S gpubin/attn_bench 8 2048 32 8 128 > $L/ncu_fwd128.log 2>&1
timeout 40 ncu --clock-control none --kernel-name regex:flash_bwd_sm90 --launch-skip 3 --launch-count 1 $S gpubin/attn_bench 8 2048 32 8 64 > $L/ncu_bwd64.log 2>&1
grep -E "Duration|DRAM Throughput|L2 Hit Rate" $L/ncu_*.log; echo "ncu at $(( $(date +%s)-T0 ))s"; pack
left=$(( 330 - $(date +%s) + T0 ))
timeout $left gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
