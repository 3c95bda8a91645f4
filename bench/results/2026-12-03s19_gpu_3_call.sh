#!/bin/bash
# session 19 call 3: split masters in training against transformers through the sliding engine
# (every blob on the host, upload copies forced: every master split): 3 AdamW steps of four tiny
# models and the 100-step curve; then 8B at 24 GiB, no clip, new (the planner now takes split copies).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
timeout 330 python3 tools/hf_train_compare.py --bin gpubin/slideformer --device cuda \
  --cli-args "--offload --slots 3 --gpu-blobs 0 --upload-copies on" --work /tmp/tc > $L/train_compare.log 2>&1
echo "train_compare rc=$? at $(( $(date +%s)-T0 ))s"; grep -iE "pass|fail|curve|mean" $L/train_compare.log | tail -12; pack
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
timeout 150 gpubin/slideformer bench $O --preset llama-8b --gpu-memory 24GiB --max-grad-norm 0 > $L/l8_new.json 2> $L/l8_new.log
echo "l8 rc=$?"; grep -E "bench:.*steady|^plan:" $L/l8_new.log | cut -c1-300; pack
echo "at $(( $(date +%s)-T0 ))s"
