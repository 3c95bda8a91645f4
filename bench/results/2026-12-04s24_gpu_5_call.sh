#!/bin/bash
# session 24 call 5: why the in-step parameter pass (3B at 24 GiB, clip 1: ~19 ms a layer = ~5.2 G
# parameters/s) is slower than the pass alone (session 19: 8.44 G/s): the host's layout, the pass
# alone at 16 and 8 threads, the step at SF_THREADS 8 (traced) against the default.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
(lscpu; echo; numactl -H 2>&1; echo; cat /sys/kernel/mm/transparent_hugepage/enabled; nproc; free -g) > $L/host.txt 2>&1; grep -E "Model name|Socket|NUMA|Thread|Core|^CPU\(s\)|L3|Flags" $L/host.txt | cut -c1-200
SF_THREADS=16 timeout 100 gpubin/bench_adamw 64 > $L/adamw16.log 2>&1; echo "adamw16 at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/adamw16.log
SF_THREADS=8 timeout 100 gpubin/bench_adamw 64 > $L/adamw8.log 2>&1; echo "adamw8 at $(( $(date +%s)-T0 ))s"; grep -v "^{" $L/adamw8.log | grep -i "split"; pack
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
for t in 8 16; do
SF_THREADS=$t SF_TRACE=$L/trace_t$t.jsonl timeout 120 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b3_24_t$t.log 2>&1; echo "t$t rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^bench:" $L/b3_24_t$t.log | head -2; grep -o '"host_update_ms":[0-9.]*' $L/b3_24_t$t.log
python3 tools/trace_summary.py $L/trace_t$t.jsonl > $L/trace_t${t}_summary.txt 2>&1; sed -n 1,6p $L/trace_t${t}_summary.txt; gzip $L/trace_t$t.jsonl; pack
done
echo "done at $(( $(date +%s)-T0 ))s"
