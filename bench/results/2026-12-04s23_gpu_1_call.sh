#!/bin/bash
# session 23 call 1: the whole GPU suite (CudaState.* for the first time on a GPU), the SASS of the
# sm_90 backward kernels, ncu SourceCounters (per-instruction counts, stall samples) of our hd-64
# backward and cuDNN's, for the instruction excess (446 M against 329 M).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
which cuobjdump nvdisasm ncu > $L/tools.txt 2>&1; cat $L/tools.txt
timeout 170 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
cuobjdump -sass gpubin/attn_bench > /tmp/all.sass 2>&1; echo "sass rc=$? $(wc -l < /tmp/all.sass) lines"
awk '/Function :/{keep = ($0 ~ /flash_bwd_sm90/)} keep' /tmp/all.sass > $L/bwd_sm90.sass
grep "Function :" /tmp/all.sass | grep sm90 > $L/sm90_functions.txt; cat $L/sm90_functions.txt
cuobjdump -res-usage gpubin/attn_bench 2>&1 | grep -A1 sm90 > $L/res_usage.txt
xz -k $L/bwd_sm90.sass; rm $L/bwd_sm90.sass; pack
N="--clock-control none --section SourceCounters --section InstructionStats --section WarpStateStats --section SchedulerStats"
timeout 120 ncu $N --kernel-name regex:flash_bwd_sm90 --launch-skip 1 --launch-count 1 -o $L/ours64 gpubin/attn_bench 8 2048 32 8 64 > $L/ncu_ours64.log 2>&1
echo "ncu ours rc=$? at $(( $(date +%s)-T0 ))s"; tail -3 $L/ncu_ours64.log
ncu -i $L/ours64.ncu-rep --page source --csv --print-source sass > $L/ours64_source.csv 2>&1; echo "src rc=$? $(wc -l < $L/ours64_source.csv)"
ncu -i $L/ours64.ncu-rep --page details > $L/ours64_details.txt 2>&1
xz $L/ours64_source.csv; pack
timeout 150 ncu $N --kernel-name regex:bprop --launch-skip 1 --launch-count 1 -o $L/cudnn64 python3 gpupack/cudnn_fwd.py 64 > $L/ncu_cudnn64.log 2>&1
echo "ncu cudnn rc=$? at $(( $(date +%s)-T0 ))s"; tail -3 $L/ncu_cudnn64.log
ncu -i $L/cudnn64.ncu-rep --page source --csv --print-source sass > $L/cudnn64_source.csv 2>&1; echo "src rc=$? $(wc -l < $L/cudnn64_source.csv)"
ncu -i $L/cudnn64.ncu-rep --page details > $L/cudnn64_details.txt 2>&1
xz $L/cudnn64_source.csv; rm -f $L/*.ncu-rep; pack
echo "done at $(( $(date +%s)-T0 ))s"
