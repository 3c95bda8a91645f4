#!/bin/bash
# session 14 call 3: held gradients from the top of the forward order (the planner's choice by
# default without clipping): OLMoE at 24 GiB beside PyTorch, auto vs none; 3B all-host no clip with
# 7 layers + head held vs none; the sliding-engine GPU tests
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer; G=gpubin/sf_gpu_tests
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
s t_engines 100 $G --gtest_brief=1 --gtest_filter='CudaEngines.*:CudaUploadCopies.*'
grep -E "PASSED|FAILED|Failure" $L/t_engines.log | head; pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1 --max-grad-norm 0"
s torch_olmoe 110 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm
tail -1 $L/torch_olmoe.log | cut -c1-300; pack
for c in auto 0; do
  [ $(el) -gt 380 ] && break
  if [ $c = auto ]; then unset SF_HOLD_GRADS; else export SF_HOLD_GRADS=0; fi
  t0=$(date +%s); SF_TRACE=$L/trolmoe_$c.jsonl timeout 110 $B bench --preset olmoe-1b-7b $O --gpu-memory 24GiB --optimizer-state bf16 > $L/olmoe_$c.json 2> $L/olmoe_$c.log; echo "olmoe_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/olmoe_$c.log; grep -o "\"hold_grads\":[0-9]*" $L/olmoe_$c.json $L/olmoe_$c.log
  python3 tools/trace_summary.py $L/trolmoe_$c.jsonl --layers > $L/trolmoe_$c.txt 2>&1; sed -n 1,5p $L/trolmoe_$c.txt | cut -c1-400
  pack
done
unset SF_HOLD_GRADS
for c in 700000000 0; do
  [ $(el) -gt 470 ] && break
  t0=$(date +%s); SF_HOLD_GRADS=$c SF_TRACE=$L/tr3b_$c.jsonl timeout 60 $B bench --preset llama-3b $O --offload --gpu-blobs 0 > $L/h3b_$c.json 2> $L/h3b_$c.log; echo "h3b_$c rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady" $L/h3b_$c.log; grep -o "\"hold_grads\":[0-9]*" $L/h3b_$c.json $L/h3b_$c.log
  python3 tools/trace_summary.py $L/tr3b_$c.jsonl --layers > $L/tr3b_$c.txt 2>&1; sed -n 1,5p $L/tr3b_$c.txt | cut -c1-300
  pack
done
echo total $(el)s
