#!/bin/bash
# session 17 call 1: held updates begun as their gradients land (new binary, the planner's count and
# share) against session 16's binary (old): the GPU tests of the engines (CudaUpdateParts new); 3B
# all-host no clip alternated new/old twice, the first of each traced; OLMoE-1B-7B at 24 GiB, bf16
# state, no clip, new and old beside PyTorch (grouped_mm) in the same call
mkdir -p old && tar xJf gpupack/old.tar.xz -C old; tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; pack; }
run() { local n=$1 b=$2 tr=$3 t=$4; shift 4; local t0=$(date +%s)
  if [ -n "$tr" ]; then export SF_TRACE=$L/tr_$n.jsonl; else unset SF_TRACE; fi
  timeout $t $b bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  unset SF_TRACE
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-330
  [ -n "$tr" ] && python3 tools/trace_summary.py $L/tr_$n.jsonl --layers > $L/tr_$n.txt 2>&1
  pack; }
H3="--preset llama-3b --offload --gpu-blobs 0 --max-grad-norm 0"
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
s t_engines 200 gpubin/sf_gpu_tests --gtest_filter='CudaUpdateParts*:CudaEngines*:CudaUploadCopies*'
grep -E "PASSED|FAILED|SKIPPED|masters with" $L/t_engines.log | head -20
run new_1 gpubin/slideformer 1 75 $H3
run old_1 old/gpubin/slideformer 1 75 $H3
run new_2 gpubin/slideformer "" 75 $H3
run old_2 old/gpubin/slideformer "" 75 $H3
for n in new_1 old_1; do sed -n 1,6p $L/tr_$n.txt | cut -c1-200; done
echo "at $(el)s"
run olmoe_new gpubin/slideformer 1 110 $HO
run olmoe_old old/gpubin/slideformer "" 110 $HO
s torch_olmoe 150 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm
tail -4 $L/torch_olmoe.log | cut -c1-300
sed -n 1,6p $L/tr_olmoe_new.txt | cut -c1-200
echo total $(el)s
