#!/bin/bash
# session 24 call 2: the candidate (O by TMA stores + the producer's record starts after its
# first copies): hd-256 backward patch (b256) A/B; ncu SourceCounters of the bounded hd-64 forward
# on one-record rows against the plain causal one (the bounded kernel's own cost); attention
# beside torch; the whole GPU suite.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
ab() {  # $1 = log, $2 = rounds, rest = shape
  local log=$1 n=$2; shift 2
  for r in $(seq $n); do for v in new b256; do
    b=gpubin/attn_bench; [ $v = b256 ] && b=gpubin/b256/attn_bench
    echo "$v r$r $(timeout 60 $b "$@" 2>&1 | grep RESULT | sed 's/RESULT sf_attn path=auto//')" >> $L/$log
  done; done
}
ab ab_256.log 3 8 2048 8 4 256
ab ab_256.log 2 8 2048 8 4 256 --pack 512
ab ab_256.log 2 8 2048 8 4 256 --window 1024
cat $L/ab_256.log; echo "ab at $(( $(date +%s)-T0 ))s"; pack
N="--clock-control none --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis"
prof() {  # $1 name, $2 kernel regex, $3 skip, rest = command
  local n=$1 k=$2 sk=$3; shift 3
  timeout 60 ncu $N --kernel-name regex:$k --launch-skip $sk --launch-count 1 -o $L/$n "$@" > $L/ncu_$n.log 2>&1
  echo "ncu $n rc=$? at $(( $(date +%s)-T0 ))s"
  ncu -i $L/$n.ncu-rep --page source --csv --print-source sass > $L/${n}_source.csv 2>&1
  ncu -i $L/$n.ncu-rep --page details > $L/${n}_details.txt 2>&1
  xz $L/${n}_source.csv; rm -f $L/$n.ncu-rep; pack
}
prof fwd64_b512 flash_fwd_sm90 3 gpubin/attn_bench 32 512 32 8 64 --pack 512
prof fwd64_512 flash_fwd_sm90 3 gpubin/attn_bench 32 512 32 8 64
grep -E "Duration|Executed Instructions  " $L/*_details.txt
timeout 120 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT (torch_flash|torch_cudnn|attn_hd)|FAIL|attn_parity|  hd|pack" $L/attn.log | head -40; pack
timeout 200 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
echo "done at $(( $(date +%s)-T0 ))s"
