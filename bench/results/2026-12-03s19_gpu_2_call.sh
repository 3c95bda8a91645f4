#!/bin/bash
# session 19 call 2: split masters with the AVX2 path in fewest instructions. bench_adamw (the three
# parameter forms); OLMoE-1B-7B at 24 GiB, bf16 state, no clip: old/new alternated twice (old first
# this time); 3B all-host no clip and 3B at 24 GiB clip 1 (fp32 state: the planner now takes split
# copies there too), new/old; PyTorch OLMoE (grouped_mm) last.
mkdir -p old && tar xJf gpupack/old.tar.xz -C old; tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
run() { local n=$1 b=$2 t=$3; shift 3; local t0=$(date +%s)
  timeout $t $b bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-300
  python3 -c "import json; j=json.load(open('$L/$n.json')); print({k: j[k] for k in j if k in ('host_update_ms','uploads_per_step','pinned_bytes','peak_rss_bytes','upload_copies')})" 2>/dev/null
  pack; }
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
H3="--preset llama-3b --offload --gpu-blobs 0 --max-grad-norm 0"
C3="--preset llama-3b --gpu-memory 24GiB --max-grad-norm 1"
timeout 60 gpubin/bench_adamw 64 > $L/bench_adamw.log 2>&1; echo "bench_adamw rc=$?"; grep -E "fused|params" $L/bench_adamw.log; pack
run o_old1 old/gpubin/slideformer 95 $HO
run o_new1 gpubin/slideformer 95 $HO
run o_old2 old/gpubin/slideformer 95 $HO
run o_new2 gpubin/slideformer 95 $HO
echo "at $(( $(date +%s)-T0 ))s"
run a_new gpubin/slideformer 75 $H3
run a_old old/gpubin/slideformer 75 $H3
run c_new gpubin/slideformer 75 $C3
run c_old old/gpubin/slideformer 75 $C3
echo "at $(( $(date +%s)-T0 ))s"
timeout 100 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm > $L/torch_olmoe.log 2>&1; echo "torch rc=$?"
grep -iE "tok/s" $L/torch_olmoe.log | tail -1; pack
echo "at $(( $(date +%s)-T0 ))s"
