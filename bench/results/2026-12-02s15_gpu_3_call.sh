#!/bin/bash
# session 15 call 3: 3B all-host no clip, the planner's choice, three more runs (the spread of
# call 1 vs call 2); 3B at --gpu-memory 24GiB clip 1 and 3B all-host clip 1 on the current code
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/slideformer
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
run() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t $B bench --preset llama-3b $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-300; pack; }
for i in 1 2 3; do run h3b_$i 70 --offload --gpu-blobs 0 --max-grad-norm 0; done
run g24_clip 90 --gpu-memory 24GiB --max-grad-norm 1
run host_clip 90 --offload --gpu-blobs 0 --max-grad-norm 1
echo total $(el)s
