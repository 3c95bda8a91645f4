#!/bin/bash
# session 17 call 3: OLMoE-1B-7B at 24 GiB bf16 no clip, the planner's choice twice beside PyTorch
# (grouped_mm) between them; 8B at 24 GiB fp32 no clip, new (held updates begun early) against
# session 16's binary (old)
mkdir -p old && tar xJf gpupack/old.tar.xz -C old; tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; pack; }
run() { local n=$1 b=$2 t=$3; shift 3; local t0=$(date +%s)
  export SF_TRACE=$L/tr_$n.jsonl
  timeout $t $b bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  unset SF_TRACE
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-330
  python3 tools/trace_summary.py $L/tr_$n.jsonl --layers > $L/tr_$n.txt 2>&1
  pack; }
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
H8="--preset llama-8b --gpu-memory 24GiB --max-grad-norm 0"
run olmoe_a gpubin/slideformer 110 $HO
s torch_olmoe 150 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm
grep 'tok/s' $L/torch_olmoe.log
run olmoe_b gpubin/slideformer 110 $HO
echo "at $(el)s"
run l8b_new gpubin/slideformer 140 $H8
run l8b_old old/gpubin/slideformer 140 $H8
echo total $(el)s
