#!/bin/bash
# session 18 call 3: the planner now also places from 2 slots (OLMoE at 24 GiB: 2 slots + 4 blobs
# kept on the GPU, where 3 slots kept 3) and ties held shares to the larger one; against session 17's
# binary (old: 3 slots, 3 kept, 40 %); 8B at 24 GiB: the new tie (90 %) against 70 %
mkdir -p old && tar xJf gpupack/old.tar.xz -C old; tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
run() { local n=$1 b=$2 t=$3; shift 3; local t0=$(date +%s)
  timeout $t $b bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-300
  python3 -c "import json; j=json.load(open('$L/$n.json')); print({k: j[k] for k in j if k in ('host_update_ms','step_ms','uploads_per_step','drain_ms')})" 2>/dev/null
  pack; }
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
H8="--preset llama-8b --gpu-memory 24GiB --max-grad-norm 0"
run o_new gpubin/slideformer 100 $HO
run o_old old/gpubin/slideformer 100 $HO
run l8_new gpubin/slideformer 140 $H8
SF_HOLD_EARLY=70 run l8_e70 gpubin/slideformer 140 $H8
run o_new2 gpubin/slideformer 100 $HO
echo "at $(( $(date +%s)-T0 ))s"
timeout 130 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm > $L/torch_olmoe.log 2>&1; echo "torch rc=$?"
grep -iE "tok/s" $L/torch_olmoe.log | tail -1; pack
echo "at $(( $(date +%s)-T0 ))s"
