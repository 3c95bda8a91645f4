#!/bin/bash
# session 21 call 2: stage counts of the sm_90 attention, alternated against session 20's kernels
# (attn_bench = HEAD): hd 128 forward with Q 1 / K 3 / V 3 (f2) and Q 2 / K 3 / V 2 (f6); hd 64
# backward with 3 (b3) and 4 (b4) Q/dO stages. Then transformers parity on CUDA (HEAD binary).
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
for r in 1 2 3 4 5; do
  for v in old f2 f6; do
    b=gpubin/attn_bench_$v; [ $v = old ] && b=gpubin/attn_bench
    echo "$v r$r $(timeout 60 $b 8 2048 32 8 128 2>&1 | grep RESULT)" >> $L/ab_hd128.log
  done
  for v in old b3 b4; do
    b=gpubin/attn_bench_$v; [ $v = old ] && b=gpubin/attn_bench
    echo "$v r$r $(timeout 60 $b 8 2048 32 8 64 2>&1 | grep RESULT)" >> $L/ab_hd64.log
  done
done
for f in $L/ab_hd128.log $L/ab_hd64.log; do sed 's/RESULT sf_attn path=auto B=8 T=2048 H=32 KVH=8//; s/pack=0 window=0//' $f; done
echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 250 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda > $L/parity_cuda.log 2>&1; echo "parity rc=$? at $(( $(date +%s)-T0 ))s"
grep -iE "passed|failed" $L/parity_cuda.log | tail -3; pack
