#!/bin/bash
# session 23 call 4: the long-sequence plans with the new attention rates (657 / 524) against
# measurement on the new kernels: 8B at 24 GiB, 1 x 32768 and 1 x 54,948, clip 1; 1B resident;
# ncu SourceCounters of the hd-128 forward (for the next session).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer
K='"tokens_per_second":[0-9.]*\|"predicted_tokens_per_second":[0-9.]*\|"step_ms":[0-9.]*\|"peak_rss_bytes":[0-9]*\|"predicted_host_bytes":[0-9]*\|"setup_s":[0-9.]*'
timeout 150 $B bench --preset llama-8b --batch-size 1 --seq-len 32768 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --steps 2 --warmup 1 > $L/l8_32k.log 2>&1
echo "l8 32k rc=$? at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/l8_32k.log | tail -3; grep -o "$K" $L/l8_32k.log; pack
timeout 200 $B bench --preset llama-8b --batch-size 1 --seq-len 54948 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --steps 2 --warmup 1 > $L/l8_long.log 2>&1
echo "l8 long rc=$? at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/l8_long.log | tail -3; grep -o "$K" $L/l8_long.log; pack
timeout 80 $B bench --preset llama-1b --batch-size 8 --seq-len 2048 --device cuda --no-offload --steps 6 --warmup 2 > $L/b1_res.log 2>&1
echo "1b rc=$? at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/b1_res.log | tail -3; pack
N="--clock-control none --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight"
timeout 60 ncu $N --kernel-name regex:flash_fwd_sm90 --launch-skip 3 --launch-count 1 -o $L/fwd128 gpubin/attn_bench 8 2048 32 8 128 > $L/ncu_fwd128.log 2>&1
echo "ncu rc=$? at $(( $(date +%s)-T0 ))s"
ncu -i $L/fwd128.ncu-rep --page source --csv --print-source sass > $L/fwd128_source.csv 2>&1
ncu -i $L/fwd128.ncu-rep --page details > $L/fwd128_details.txt 2>&1
xz $L/fwd128_source.csv; rm -f $L/*.ncu-rep; pack
echo "done at $(( $(date +%s)-T0 ))s"
