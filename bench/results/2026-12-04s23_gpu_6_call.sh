#!/bin/bash
# session 23 call 6: the engines' state tests on the GPU after read_state / write_state moved to
# the Engine base (the final binary); the attention tests once more on it.
tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
timeout 100 gpubin/sf_gpu_tests --gtest_brief=1 --gtest_filter='CudaState.*:CudaEngines*:CudaUpdateParts*:CudaUploadCopies*:CudaOps.Attention*' > $L/t_state.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_state.log | head
