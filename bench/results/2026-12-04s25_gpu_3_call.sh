#!/bin/bash
# session 25 call 3 (the shipped binary): 3B at 24 GiB clip 1, fp32 moments, one and two
# micro-batches of 8 x 2048 a step, alternated twice (the chain after the norm paid once for two).
tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/late/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
$B plan --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 > $L/plan_24.log 2>&1; grep -E "^predicted|^phases|faster with" $L/plan_24.log
for r in 1 2; do for k in 1 2; do
timeout 90 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --grad-accum $k --steps 4 --warmup 1 > $L/b3_24_k${k}_r$r.log 2>&1; echo "k$k r$r rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^plan:|^bench: [0-9]" $L/b3_24_k${k}_r$r.log; grep -o '"host_update_ms":[0-9.]*\|"predicted_tokens_per_second":[0-9.]*' $L/b3_24_k${k}_r$r.log | tr '\n' ' '; echo; pack
done; done
echo "done at $(( $(date +%s)-T0 ))s"
