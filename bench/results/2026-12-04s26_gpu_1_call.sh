#!/bin/bash
# session 26 call 1 (new = the workspace as the larger of its two views + the MLP's gradients in
# place; old = session 25's shipped binary): the GPU suite whole, transformers parity, the 100-step
# curve, then 3B at 24 GiB clip 1 on both binaries.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
timeout 200 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
timeout 200 python3 tools/hf_parity.py --bin $B --device cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"; tail -1 $L/parity_cuda.log; pack
timeout 80 python3 tools/hf_train_compare.py --bin $B --device cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"; tail -2 $L/train_cuda.log; pack
for v in new old; do
b=$B; [ $v = old ] && b=gpubin/old/slideformer
timeout 80 $b bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b3_24_$v.log 2>&1; echo "$v rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^plan:|^bench: [0-9]" $L/b3_24_$v.log; grep -o '"slots":[0-9]*\|"gpu_blobs":[0-9]*\|"device_bytes":[0-9]*\|"predicted_tokens_per_second":[0-9.]*' $L/b3_24_$v.log | tr '\n' ' '; echo; pack
done
echo "done at $(( $(date +%s)-T0 ))s"
