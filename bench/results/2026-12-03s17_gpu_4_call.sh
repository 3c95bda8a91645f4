#!/bin/bash
# session 17 call 4: OLMoE-1B-7B at 24 GiB bf16 no clip: 8 GPU slots (the spare GPU memory: the
# backward's first layers still in a slot from the forward) against the planner's 3, one lease
tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L
O="--batch-size 8 --seq-len 2048 --device cuda --steps 3 --warmup 1"
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
for v in s8:--slots=8 s3:; do n=${v%%:*}; a=${v#*:}; t0=$(date +%s)
  timeout 120 gpubin/slideformer bench $O $HO $a > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-330
  python3 -c "import json; j=json.load(open('$L/$n.json')); print({k: j[k] for k in j if 'upload' in k or k in ('host_update_ms','step_ms')})"
done
