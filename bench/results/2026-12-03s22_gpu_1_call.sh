#!/bin/bash
# session 22 call 1: the paired hd-64 backward (key tiles jt and n_jt-1-jt a block, group-major)
# alternated against the shipped binary; its attention tests and parity against torch; the shipped
# binary's whole GPU suite and attention beside torch SDPA's backends; ncu's L2 view of the pairs.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
for r in 1 2 3 4; do for v in ship pairs; do
  b=gpubin/attn_bench; [ $v = pairs ] && b=gpubin/attn_bench_pairs
  echo "$v r$r $(timeout 30 $b 8 2048 32 8 64 2>&1 | grep RESULT)" >> $L/ab_hd64.log
done; done; sed 's/RESULT sf_attn path=auto B=8 T=2048 H=32 KVH=8//; s/pack=0 window=0//' $L/ab_hd64.log
for r in 1 2; do for v in ship pairs; do
  b=gpubin/attn_bench; [ $v = pairs ] && b=gpubin/attn_bench_pairs
  echo "$v r$r T8192 $(timeout 30 $b 2 8192 32 8 64 2>&1 | grep RESULT)" >> $L/ab_hd64_long.log
  echo "$v r$r T1000 $(timeout 30 $b 8 1000 32 8 64 2>&1 | grep RESULT)" >> $L/ab_hd64_long.log
done; done; sed 's/RESULT sf_attn path=auto//; s/pack=0 window=0//' $L/ab_hd64_long.log
echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 60 gpubin/sf_gpu_tests_pairs --gtest_brief=1 --gtest_filter='CudaOps.Attention*:CudaOpsCheck*:CudaOps.Packed*' > $L/t_pairs.log 2>&1; echo "pairs tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/t_pairs.log | head; pack
mkdir -p pb && cp gpubin/attn_bench_pairs pb/attn_bench
timeout 60 python3 bench/attn_vs_torch.py pb --head-dims 64 > $L/attn_pairs.log 2>&1; echo "attn pairs rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_cudnn|sf_attn path=auto|attn_hd)|parity" $L/attn_pairs.log | grep -v "parity sm80" | head -20; pack
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section InstructionStats"
timeout 40 ncu --clock-control none --kernel-name regex:flash_bwd_sm90 --launch-skip 3 --launch-count 1 $S gpubin/attn_bench_pairs 8 2048 32 8 64 > $L/ncu_bwd64_pairs.log 2>&1
grep -E "Duration|DRAM Throughput|L2 Hit Rate|Executed Instructions  " $L/ncu_*.log; echo "ncu at $(( $(date +%s)-T0 ))s"; pack
timeout 100 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_flash|torch_cudnn|sf_attn path=auto|attn_hd)|parity" $L/attn.log | grep -v "parity sm80" | head -30; pack
left=$(( 560 - $(date +%s) + T0 ))
timeout $left gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
