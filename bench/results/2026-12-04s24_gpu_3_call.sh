#!/bin/bash
# session 24 call 3: the shipping binary (O by TMA stores, record starts after the first copies
# with the no-pos fix, the hd-256 backward's mask pass and scale fold): the whole GPU suite,
# attention beside torch (and packed per token), hd 256 timings, transformers parity and the
# 100-step curve, 3B and 1B resident (the MFU fields).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
timeout 200 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
timeout 120 python3 bench/attn_vs_torch.py gpubin --head-dims 128,64 > $L/attn.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "attn_parity|ratio|packed_per_token" $L/attn.log | head -20; pack
for a in "8 2048 8 4 256" "8 2048 8 4 256 --pack 512" "8 2048 8 4 256 --window 1024"; do gpubin/attn_bench $a 2>&1 | grep RESULT >> $L/hd256.log; done; cat $L/hd256.log
timeout 200 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"; tail -2 $L/parity_cuda.log; pack
timeout 80 python3 tools/hf_train_compare.py --bin gpubin/slideformer --device cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"; tail -2 $L/train_cuda.log; pack
B=gpubin/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
for p in 3b 1b; do
timeout 100 $B bench --preset llama-$p $O --no-offload --steps 4 --warmup 1 > $L/b${p}_res.log 2>&1; echo "$p rc=$? at $(( $(date +%s)-T0 ))s"
grep -v "^{" $L/b${p}_res.log | tail -2; pack
done
echo "done at $(( $(date +%s)-T0 ))s"
