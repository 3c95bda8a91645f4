#!/bin/bash
# session 23 call 5: 3B offloaded on the new kernels (all-host no clip; 24 GiB clip 1); ncu
# SourceCounters of the packed (bounded) hd-64 forward against the unpacked 512-token rows' (the
# packed forward's 0.83x a token), of our hd-128 backward and cuDNN's (for the next session).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
timeout 100 $B bench --preset llama-3b $O --offload --gpu-blobs 0 --max-grad-norm 0 --steps 4 --warmup 1 > $L/b3_allhost.log 2>&1; echo "allhost rc=$? at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/b3_allhost.log | tail -3; pack
timeout 100 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b3_24.log 2>&1; echo "24GiB rc=$? at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/b3_24.log | tail -3; grep -o '"predicted_tokens_per_second":[0-9.]*' $L/b3_24.log; pack
N="--clock-control none --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis"
prof() {  # $1 name, $2 kernel regex, $3 skip, rest = command
  local n=$1 k=$2 sk=$3; shift 3
  timeout 60 ncu $N --kernel-name regex:$k --launch-skip $sk --launch-count 1 -o $L/$n "$@" > $L/ncu_$n.log 2>&1
  echo "ncu $n rc=$? at $(( $(date +%s)-T0 ))s"
  ncu -i $L/$n.ncu-rep --page source --csv --print-source sass > $L/${n}_source.csv 2>&1
  ncu -i $L/$n.ncu-rep --page details > $L/${n}_details.txt 2>&1
  xz $L/${n}_source.csv; rm -f $L/$n.ncu-rep; pack
}
prof fwd64_packed flash_fwd_sm90 3 gpubin/attn_bench 8 2048 32 8 64 --pack 512
prof fwd64_512 flash_fwd_sm90 3 gpubin/attn_bench 32 512 32 8 64
prof bwd128 flash_bwd_sm90 1 gpubin/attn_bench 8 2048 32 8 128
prof cudnn128 bprop 1 python3 gpupack/cudnn_fwd.py 128
echo "done at $(( $(date +%s)-T0 ))s"
