#!/bin/bash
# session 21 call 3 (final binary: hd-64 backward with 4 Q/dO stages, the planner's attention rates
# of today's kernels): the whole GPU test suite, attention against torch SDPA's backends (and the
# old hd-64 backward alternated), transformers parity, 3B offloaded (all-host no clip; 24 GiB clip 1).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
timeout 200 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran|attention forward" $L/t_all.log | head -20; pack
for r in 1 2 3; do for v in old new; do
  b=gpubin/attn_bench_$v; [ $v = new ] && b=gpubin/attn_bench
  echo "$v r$r $(timeout 60 $b 8 2048 32 8 64 2>&1 | grep RESULT)" >> $L/ab_hd64.log
done; done
sed 's/RESULT sf_attn path=auto B=8 T=2048 H=32 KVH=8//; s/pack=0 window=0//' $L/ab_hd64.log
timeout 120 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_flash|torch_cudnn|sf_attn path=auto|attn_)|parity" $L/attn.log | grep -v "parity sm80" | head -30; pack
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
timeout 100 $B bench --preset llama-3b $O --offload --gpu-blobs 0 --max-grad-norm 0 --steps 4 --warmup 1 > $L/b3_allhost.log 2>&1; echo "allhost rc=$? at $(( $(date +%s)-T0 ))s"
grep "^bench:" $L/b3_allhost.log | head -2; pack
timeout 100 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b3_24.log 2>&1; echo "24GiB rc=$? at $(( $(date +%s)-T0 ))s"
grep "^bench:" $L/b3_24.log | head -2; pack
# ncu (Firecracker: hardware counters) on our hd-128 forward and hd-64 backward and cuDNN's
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section InstructionStats"
timeout 60 ncu --clock-control none --kernel-name regex:flash_fwd_sm90 --launch-skip 3 --launch-count 1 $S gpubin/attn_bench 8 2048 32 8 128 > $L/ncu_fwd128.log 2>&1; echo "ncu1 rc=$? at $(( $(date +%s)-T0 ))s"
timeout 60 ncu --clock-control none --kernel-name regex:flash_bwd_sm90 --launch-skip 3 --launch-count 1 $S gpubin/attn_bench 8 2048 32 8 64 > $L/ncu_bwd64.log 2>&1; echo "ncu2 rc=$? at $(( $(date +%s)-T0 ))s"
timeout 60 ncu --clock-control none --kernel-name "regex:(?i)(fprop|fwd)" --launch-skip 1 --launch-count 1 $S python3 gpupack/cudnn_fwd.py 128 > $L/ncu_cudnn_fwd128.log 2>&1; echo "ncu3 rc=$? at $(( $(date +%s)-T0 ))s"
timeout 60 ncu --clock-control none --kernel-name "regex:(?i)(bprop|bwd|dgrad)" --launch-skip 1 --launch-count 1 $S python3 gpupack/cudnn_fwd.py 64 > $L/ncu_cudnn_bwd64.log 2>&1; echo "ncu4 rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" $L/ncu_*.log | head -40; pack
left=$(( 585 - $(date +%s) + T0 ))
timeout $left python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "passed|failed" $L/parity_cuda.log | tail -3; pack
