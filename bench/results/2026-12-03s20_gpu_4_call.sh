#!/bin/bash
# session 20 call 4: the sm_90 hd-256 forward (key tiles of 64, one Q buffer, PV as two n128
# halves) with call 2's backward: attention tests, parity and timing against torch (auto = sm_90
# both ways, sm80 = the old kernels), the packed rows; Gemma 3 4B resident and at 24 GiB.
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
timeout 200 gpubin/sf_gpu_tests --gtest_filter='CudaOps.Attention*:CudaOpsCheck*' --gtest_brief=1 > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED|Failure" $L/t_attn.log | head -20; pack
timeout 150 python3 bench/attn_vs_torch.py gpubin --head-dims 256 --shapes 8,2048,8,4 > $L/attn256.log 2>&1; echo "attn rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "RESULT attn_parity|FAIL" $L/attn256.log | head; tail -14 $L/attn256.log; pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
run() { local n=$1 t=$2; shift 2; local t0=$(date +%s)
  timeout $t gpubin/slideformer bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-300
  pack; }
run g2 150 --preset gemma3-4b --max-grad-norm 1
run g1 150 --preset gemma3-4b --gpu-memory 24GiB --max-grad-norm 1
echo "at $(( $(date +%s)-T0 ))s"
