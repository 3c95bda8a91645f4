#!/bin/bash
# session 13 call 2 (the first attempt was lost with the machine): issue 17's 13B, bf16 state, 24 GiB,
# on the NVMe tier (call 1: 0.836 of its plan over 2 steps; session 7: 0.975): 4 steps, traced
tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L /tmp/sf_off
B=gpubin/slideformer
t0=$(date +%s); SF_TRACE=$L/n13.trace.jsonl timeout 250 $B bench --preset llama-13b --batch-size 8 --seq-len 2048 --steps 4 --warmup 1 \
  --device cuda --gpu-memory 24GiB --offload-dir /tmp/sf_off --max-grad-norm 1 --optimizer-state bf16 > $L/n13.json 2> $L/n13.log; echo "nvme13 rc=$? $(( $(date +%s)-t0 ))s"
grep -E "^plan|^bench" $L/n13.log | cut -c1-250
python3 tools/trace_summary.py $L/n13.trace.jsonl > $L/n13.trace.txt 2>&1; head -12 $L/n13.trace.txt
xz -T4 $L/n13.trace.jsonl
tar czf $OUT/logs.tgz -C $OUT logs
