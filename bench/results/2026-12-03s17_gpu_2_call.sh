#!/bin/bash
# session 17 call 2: the held updates' early share, swept (SF_HOLD_EARLY) around the planner's choice:
# OLMoE-1B-7B at 24 GiB bf16 state no clip (the planner's, 55 %, every host layer held at 50 %) beside
# PyTorch (grouped_mm) again; 3B all-host no clip at 0 / 50 / 85 / 100 % with the planner's count
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; pack; }
run() { local n=$1 t=$2; shift 2; local t0=$(date +%s)
  export SF_TRACE=$L/tr_$n.jsonl
  timeout $t gpubin/slideformer bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  unset SF_TRACE SF_HOLD_EARLY SF_HOLD_GRADS
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-330
  python3 tools/trace_summary.py $L/tr_$n.jsonl --layers > $L/tr_$n.txt 2>&1
  pack; }
H3="--preset llama-3b --offload --gpu-blobs 0 --max-grad-norm 0"
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
run olmoe_auto 110 $HO
s torch_olmoe 150 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm
tail -3 $L/torch_olmoe.log | head -1
export SF_HOLD_EARLY=55; run olmoe_e55 110 $HO
export SF_HOLD_EARLY=50 SF_HOLD_GRADS=1099511627776; run olmoe_all_e50 110 $HO
echo "at $(el)s"
for e in 0 50 85 100; do export SF_HOLD_EARLY=$e; run h3b_e$e 75 $H3; done
echo total $(el)s
