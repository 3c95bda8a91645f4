#!/bin/bash
# session 26 call 2: 8B at 24 GiB clip 1, 8 x 2048, new and old; the longest 8B sequence at 24 GiB
# by the plan of each binary, and the new one trained at its longest for 2 steps (peak RSS).
tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer
for v in new old; do
b=$B; [ $v = old ] && b=gpubin/old/slideformer
timeout 120 $b bench --preset llama-8b --batch-size 8 --seq-len 2048 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b8_24_$v.log 2>&1; echo "$v rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^plan:|^bench: [0-9]" $L/b8_24_$v.log; grep -o '"slots":[0-9]*\|"gpu_blobs":[0-9]*\|"peak_rss_bytes":[0-9]*\|"predicted_tokens_per_second":[0-9.]*' $L/b8_24_$v.log | tr '\n' ' '; echo; pack
$b plan --preset llama-8b --batch-size 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --longest-seq > $L/longest_$v.log 2>&1; grep -E "longest|workspace|^predicted" $L/longest_$v.log
done
N=$(grep -o "fits: [0-9]*" $L/longest_new.log | grep -o "[0-9]*")
echo "longest new: $N"; pack
timeout 240 $B bench --preset llama-8b --batch-size 1 --seq-len $N --device cuda --gpu-memory 24GiB --max-grad-norm 1 --steps 2 --warmup 1 > $L/b8_longest_new.log 2>&1; echo "longest rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^plan:|^bench: [0-9]" $L/b8_longest_new.log; grep -o '"peak_rss_bytes":[0-9]*\|"host_bytes":[0-9]*\|"device_bytes":[0-9]*\|"predicted_tokens_per_second":[0-9.]*\|"setup_s":[0-9.]*' $L/b8_longest_new.log | tr '\n' ' '; echo; tail -3 $L/b8_longest_new.log | cut -c1-300
free -g; pack
echo "done at $(( $(date +%s)-T0 ))s"
