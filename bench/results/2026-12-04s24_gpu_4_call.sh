#!/bin/bash
# session 24 call 4: 3B at --gpu-memory 24GiB, clip 1, on the new kernels: fp32 state (with a
# step timeline, SF_TRACE) and bf16 state (the owner's alternative for issue 19's 20,300).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
SF_TRACE=$L/trace24.jsonl timeout 120 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b3_24.log 2>&1; echo "24 fp32 rc=$? at $(( $(date +%s)-T0 ))s"
grep -v "^{" $L/b3_24.log | grep -E "plan:|bench:" ; grep -o '"predicted_tokens_per_second":[0-9.]*\|"host_update_ms":[0-9.]*\|"predicted_phases":{[^}]*}' $L/b3_24.log
python3 tools/trace_summary.py $L/trace24.jsonl > $L/trace24_summary.txt 2>&1; head -40 $L/trace24_summary.txt; gzip $L/trace24.jsonl; pack
timeout 120 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --optimizer-state bf16 --steps 4 --warmup 1 > $L/b3_24_bf16.log 2>&1; echo "24 bf16 rc=$? at $(( $(date +%s)-T0 ))s"
grep -v "^{" $L/b3_24_bf16.log | grep -E "plan:|bench:" ; grep -o '"predicted_tokens_per_second":[0-9.]*\|"host_update_ms":[0-9.]*\|"predicted_phases":{[^}]*}' $L/b3_24_bf16.log; pack
echo "done at $(( $(date +%s)-T0 ))s"
