#!/bin/bash
# session 16 call 1: the embedding's rows in two parts (new binary) against session 15's binary (old),
# 3B all-host no clip, alternated new/old twice, the first of each traced; the GPU tests of the
# engines (the new CudaEmbeddingRows among them); Qwen3-30B-A3B's 4-layer cut at 24 GiB against its plan
mkdir -p old && tar xJf gpupack/old.tar.xz -C old; tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; pack; }
run() { local n=$1 b=$2 tr=$3; shift 3; local t0=$(date +%s)
  if [ -n "$tr" ]; then export SF_TRACE=$L/tr_$n.jsonl; else unset SF_TRACE; fi
  timeout 75 $b bench --preset llama-3b $O --offload --gpu-blobs 0 --max-grad-norm 0 > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  unset SF_TRACE
  grep -E "bench:.*steady|host AdamW|^plan:" $L/$n.log | cut -c1-260
  [ -n "$tr" ] && python3 tools/trace_summary.py $L/tr_$n.jsonl --layers > $L/tr_$n.txt 2>&1
  pack; }
s t_engines 240 gpubin/sf_gpu_tests --gtest_filter='CudaEmbeddingRows*:CudaEngines*:CudaUploadCopies*:CudaSelectiveRecompute*'
grep -E "PASSED|FAILED|SKIPPED|masters with" $L/t_engines.log | head -20
run new_1 gpubin/slideformer 1
run old_1 old/gpubin/slideformer 1
run new_2 gpubin/slideformer ""
run old_2 old/gpubin/slideformer ""
for n in new_1 old_1; do sed -n 4,6p $L/tr_$n.txt | cut -c1-200; done
if [ $(el) -lt 420 ]; then
  t0=$(date +%s); timeout 150 gpubin/slideformer bench --preset qwen3-30b-a3b --layers 4 $O --gpu-memory 24GiB --max-grad-norm 1 > $L/qwen3_4l.json 2> $L/qwen3_4l.log; echo "qwen3_4l rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/qwen3_4l.log | cut -c1-300; pack
fi
echo total $(el)s
