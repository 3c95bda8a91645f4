#!/bin/bash
# session 18 call 1: more GPU slots from the spare GPU memory (new: the planner's count; old:
# session 17's binary, 3 slots): the GPU engine tests; 3B all-host no clip alternated new/old twice
# (+ new with --upload-copies on: the planner now takes none with every layer in a slot); OLMoE-1B-7B
# at 24 GiB bf16 no clip new/old beside PyTorch (grouped_mm)
mkdir -p old && tar xJf gpupack/old.tar.xz -C old; tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
run() { local n=$1 b=$2 t=$3; shift 3; local t0=$(date +%s)
  timeout $t $b bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-420
  python3 -c "import json; j=json.load(open('$L/$n.json')); print({k: j[k] for k in j if 'upload' in k or k in ('host_update_ms','step_ms')})" 2>/dev/null
  pack; }
H3="--preset llama-3b --offload --gpu-blobs 0 --max-grad-norm 0"
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
timeout 200 gpubin/sf_gpu_tests --gtest_filter='CudaUpdateParts*:CudaEngines*:CudaUploadCopies*' > $L/t_engines.log 2>&1; echo "tests rc=$?"
grep -E "PASSED|FAILED|SKIPPED" $L/t_engines.log | head -20; pack
run new_1 gpubin/slideformer 75 $H3
run old_1 old/gpubin/slideformer 75 $H3
run new_2 gpubin/slideformer 75 $H3
run old_2 old/gpubin/slideformer 75 $H3
run new_cp gpubin/slideformer 75 $H3 --upload-copies on
echo "at $(( $(date +%s)-T0 ))s"
run olmoe_new gpubin/slideformer 100 $HO
run olmoe_old old/gpubin/slideformer 100 $HO
timeout 150 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm > $L/torch_olmoe.log 2>&1; echo "torch rc=$?"
grep -iE "tokens/s|tok/s" $L/torch_olmoe.log | tail -2; pack
echo "at $(( $(date +%s)-T0 ))s"
