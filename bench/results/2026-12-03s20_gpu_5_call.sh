#!/bin/bash
# session 20 call 5 (final binary: the sm_90 hd-256 forward and backward, the small sm_80 tiles,
# the planner's hd-256 shares): the whole GPU test suite, transformers parity of the tiny models
# (gemma3_hd256 runs the sm_90 hd-256 kernels both ways), the training comparison, and the
# attention at hd 128 (unchanged kernels: the same call's reference).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
timeout 260 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
timeout 150 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "gemma3_hd256.*grad max|passed|failed" $L/parity_cuda.log | tail -4; pack
timeout 150 python3 tools/hf_train_compare.py --bin gpubin/slideformer --device cuda --work /tmp/train_cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "passed|failed" $L/train_cuda.log | tail -2; pack
timeout 100 python3 bench/attn_vs_torch.py gpubin --head-dims 128 --no-parity > $L/attn128.log 2>&1; echo "attn128 rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT attn_hd128" $L/attn128.log; pack
