#!/bin/bash
# session 25 call 2, the late binary (bounded first QK^T early + the O store's Q release under the
# next tile's first QK^T): transformers parity, the 100-step curve, 3B resident; then the 3B at
# 24 GiB clip 1 step at SF_THREADS 14 / 15 / 16 alternated (the host pass's threads beside the
# driver's and the engine's own).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
B=gpubin/late/slideformer; O="--batch-size 8 --seq-len 2048 --device cuda"
timeout 200 python3 tools/hf_parity.py --bin $B --device cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"; tail -1 $L/parity_cuda.log; pack
timeout 80 python3 tools/hf_train_compare.py --bin $B --device cuda > $L/train_cuda.log 2>&1; echo "train rc=$? at $(( $(date +%s)-T0 ))s"; tail -2 $L/train_cuda.log; pack
timeout 75 $B bench --preset llama-3b $O --steps 4 --warmup 1 > $L/b3_res.log 2>&1; echo "res rc=$? at $(( $(date +%s)-T0 ))s"; grep -E "^bench: [0-9]" $L/b3_res.log; pack
for r in 1 2; do for t in 16 15 14; do
SF_THREADS=$t timeout 75 $B bench --preset llama-3b $O --gpu-memory 24GiB --max-grad-norm 1 --steps 4 --warmup 1 > $L/b3_24_t${t}_r$r.log 2>&1; echo "t$t r$r rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "^bench: [0-9]" $L/b3_24_t${t}_r$r.log; grep -o '"host_update_ms":[0-9.]*' $L/b3_24_t${t}_r$r.log; pack
done; done
echo "done at $(( $(date +%s)-T0 ))s"
