#!/bin/bash
# session 15 call 2: 3B all-host no clip with the planner's held gradients (twice) beside PyTorch
# eager in the same call; OLMoE at 24 GiB (planner's choice, traced) beside PyTorch grouped_mm
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1 --max-grad-norm 0"
s torch_3b 150 python3 bench/torch_train_baseline.py --preset 3b --steps 3 --warmup 1
tail -1 $L/torch_3b.log | cut -c1-300; pack
for i in 1 2; do
  t0=$(date +%s); SF_TRACE=$L/tr3b_$i.jsonl timeout 70 $B bench --preset llama-3b $O --offload --gpu-blobs 0 > $L/h3b_$i.json 2> $L/h3b_$i.log; echo "h3b_$i rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/h3b_$i.log | cut -c1-300
  python3 tools/trace_summary.py $L/tr3b_$i.jsonl --layers > $L/tr3b_$i.txt 2>&1; pack
done
s torch_olmoe 120 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm
tail -1 $L/torch_olmoe.log | cut -c1-300; pack
if [ $(el) -lt 420 ]; then
  t0=$(date +%s); SF_TRACE=$L/trolmoe.jsonl timeout 110 $B bench --preset olmoe-1b-7b $O --gpu-memory 24GiB --optimizer-state bf16 > $L/olmoe.json 2> $L/olmoe.log; echo "olmoe rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/olmoe.log | cut -c1-300
  python3 tools/trace_summary.py $L/trolmoe.jsonl --layers > $L/trolmoe.txt 2>&1; sed -n 6,7p $L/trolmoe.txt | cut -c1-600; pack
fi
echo total $(el)s
