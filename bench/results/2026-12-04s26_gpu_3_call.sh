#!/bin/bash
# session 26 call 3 (new = + kept layers' gradients in bf16; mid = call 1-2's binary, the smaller
# workspace; old = session 25's): the GPU suite whole (kept layers now in the sliding-vs-resident
# and upload-copy GPU tests), transformers parity, the 100-step curve; 3B at 24 GiB clip 1 on the
# three binaries alternated twice.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
timeout 200 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; grep -E "blobs on the GPU" $L/t_all.log | head -30; pack
timeout 200 python3 tools/hf_parity.py --bin $B --device cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"; tail -1 $L/parity_cuda.log; pack
timeout 80 python3 tools/hf_train_compare.py --bin $B --device cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"; tail -2 $L/train_cuda.log; pack
for r in 1 2; do for v in new mid old; do
b=$B; [ $v != new ] && b=gpubin/$v/slideformer
timeout 80 $b bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b3_24_${v}_r$r.log 2>&1; echo "$v r$r rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^plan:|^bench: [0-9]" $L/b3_24_${v}_r$r.log | cut -c1-200; grep -o '"host_update_ms":[0-9.]*\|"predicted_tokens_per_second":[0-9.]*' $L/b3_24_${v}_r$r.log | tr '\n' ' '; echo; pack
done; done
echo "done at $(( $(date +%s)-T0 ))s"
