#!/bin/bash
# session 18 call 2: OLMoE-1B-7B at 24 GiB bf16 no clip: call 1's new plan (9 slots, 30 % early) was
# 0.89x the old (3 slots, 40 %): attribute it — new auto, new with 40 %, new with 3 slots, old; then
# 3B at 24 GiB clip 1 new/old
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
run o_new gpubin/slideformer 100 $HO
SF_HOLD_EARLY=40 run o_new_e40 gpubin/slideformer 100 $HO
run o_new_s3 gpubin/slideformer 100 $HO --slots 3
run o_old old/gpubin/slideformer 100 $HO
SF_HOLD_EARLY=30 run o_new_s3_e30 gpubin/slideformer 100 $HO --slots 3
echo "at $(( $(date +%s)-T0 ))s"
H24="--preset llama-3b --gpu-memory 24GiB --max-grad-norm 1"
run c_new gpubin/slideformer 80 $H24
run c_old old/gpubin/slideformer 80 $H24
echo "at $(( $(date +%s)-T0 ))s"
