#!/bin/bash
# session 21 call 5: the hd-64 backward with key tiles paired (jt, n_jt-1-jt) a block, group-major,
# alternated against the previous binary (whole-grid longest first); the attention tests.
tar xJf gpupack/bin.tar.xz
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
for hd in 64 128; do for r in 1 2 3 4; do for v in prev new; do
  [ $hd = 128 ] && [ $r -gt 2 ] && continue
  b=gpubin/attn_bench_$v; [ $v = new ] && b=gpubin/attn_bench
  echo "$v r$r $(timeout 30 $b 8 2048 32 8 $hd 2>&1 | grep RESULT)" >> $L/ab_hd$hd.log
done; done; sed 's/RESULT sf_attn path=auto B=8 T=2048 H=32 KVH=8//; s/pack=0 window=0//' $L/ab_hd$hd.log; done
echo "ab at $(( $(date +%s)-T0 ))s"; pack
timeout 90 gpubin/sf_gpu_tests --gtest_brief=1 --gtest_filter='CudaOps.Attention*:CudaOpsCheck*:CudaOps.Packed*' > $L/t_attn.log 2>&1; echo "tests rc=$? at $(( $(date +%s)-T0 ))s"
grep -E "PASSED|FAILED|SKIPPED" $L/t_attn.log | head; pack
