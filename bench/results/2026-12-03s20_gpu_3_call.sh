#!/bin/bash
# session 20 call 3: the whole GPU test suite, transformers parity of the tiny models (gemma3_hd256
# runs the new sm_90 hd-256 backward) and the 3-step / 100-step training comparison on CUDA.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
timeout 260 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
timeout 150 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "passed|failed|gemma3_hd256.*(FAIL|ok)" $L/parity_cuda.log | tail -8; pack
timeout 150 python3 tools/hf_train_compare.py --bin gpubin/slideformer --device cuda --work /tmp/train_cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "passed|failed" $L/train_cuda.log | tail -4; pack
