#!/bin/bash
# session 22 call 2: the dQ accumulator cleared by the D pass (no memset) alternated against the
# shipped binary; every kernel of one fwd+bwd, ours and cuDNN's through torch (ncu durations); the
# backward kernels' counters at hd 128; the whole GPU suite on the new binary; attention beside torch.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
for hd in 128 64; do for r in 1 2 3 4; do for v in prev new; do
  b=gpubin/attn_bench_$v; [ $v = new ] && b=gpubin/attn_bench
  echo "$v r$r $(timeout 30 $b 8 2048 32 8 $hd 2>&1 | grep RESULT)" >> $L/ab_hd$hd.log
done; done; sed 's/RESULT sf_attn path=auto B=8 T=2048 H=32 KVH=8//; s/pack=0 window=0//' $L/ab_hd$hd.log; done
for r in 1 2; do for v in prev new; do
  b=gpubin/attn_bench_$v; [ $v = new ] && b=gpubin/attn_bench
  echo "$v r$r $(timeout 30 $b 8 2048 8 4 256 2>&1 | grep RESULT)" >> $L/ab_hd256.log
done; done; sed 's/RESULT sf_attn path=auto B=8 T=2048//; s/pack=0 window=0//' $L/ab_hd256.log
echo "ab at $(( $(date +%s)-T0 ))s"; pack
M="--metrics gpu__time_duration.sum"
timeout 60 ncu --clock-control none $M --launch-skip 60 --launch-count 16 gpubin/attn_bench 8 2048 32 8 128 > $L/ncu_ours_all128.log 2>&1
timeout 60 ncu --clock-control none $M --launch-skip 60 --launch-count 16 gpubin/attn_bench 8 2048 32 8 64 > $L/ncu_ours_all64.log 2>&1
for hd in 128 64; do
timeout 90 ncu --clock-control none $M --nvtx --nvtx-include "step/" python3 gpupack/torch_attn_steps.py $hd CUDNN_ATTENTION > $L/ncu_cudnn_all$hd.log 2>&1
done
grep -hE "^  [a-zA-Z_].*\(|gpu__time_duration" $L/ncu_*all*.log | sed -E 's/\(CUtensorMap.*//; s/Context 1.*//' | cut -c1-150 | head -150; echo "ncu at $(( $(date +%s)-T0 ))s"; pack
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section InstructionStats --section LaunchStats --section WarpStateStats"
timeout 40 ncu --clock-control none --kernel-name regex:flash_bwd_sm90 --launch-skip 3 --launch-count 1 $S gpubin/attn_bench 8 2048 32 8 128 > $L/ncu_bwd128.log 2>&1
timeout 60 ncu --clock-control none --kernel-name "regex:(?i)bprop" --launch-skip 1 --launch-count 1 $S python3 gpupack/torch_attn_steps.py 128 CUDNN_ATTENTION > $L/ncu_cudnn_bwd128.log 2>&1
grep -E "^  [a-zA-Z_].*\(|Duration|L2 Hit|DRAM Through|Executed Instructions  |Grid Size|Registers Per|Dynamic Shared|Warp Cycles Per Issued" $L/ncu_bwd128.log $L/ncu_cudnn_bwd128.log | cut -c1-160; echo "ncu2 at $(( $(date +%s)-T0 ))s"; pack
timeout 150 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
left=$(( 570 - $(date +%s) + T0 ))
timeout $left python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_flash|torch_cudnn|sf_attn path=auto|attn_hd)|parity.*(fail|FAIL)|attn_parity" $L/attn.log | head -30; pack
