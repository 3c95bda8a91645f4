#!/bin/bash
# session 24 call 7: 3B at --gpu-memory 24GiB, clip 1, fp32 and bf16 moments on one lease (the
# shipped binary), alternated: the owner's two options for issue 19's 20,300 side by side.
tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
for r in 1 2; do for st in fp32 bf16; do
timeout 75 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --optimizer-state $st --steps 4 --warmup 1 > $L/b3_24_${st}_r$r.log 2>&1; echo "$st r$r rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^bench: [0-9]" $L/b3_24_${st}_r$r.log; grep -o '"host_update_ms":[0-9.]*\|"predicted_tokens_per_second":[0-9.]*' $L/b3_24_${st}_r$r.log | tr '\n' ' '; echo
done; done
echo "done at $(( $(date +%s)-T0 ))s"
