#!/bin/bash
# session 19 call 1: split masters (a bf16 upload copy is its master's high half: 4 B a host
# parameter instead of 6, 2 pinned instead of 6, the AdamW pass writes 4 B of parameter instead of
# 6). The whole GPU test suite on the new binary; OLMoE-1B-7B at 24 GiB, bf16 state, no clip:
# new/old alternated twice (old: session 18's final binary, HEAD 8690eb0), then PyTorch (grouped_mm).
mkdir -p old && tar xJf gpupack/old.tar.xz -C old; tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
pack() { tar czf $OUT/logs.tgz -C $OUT logs; }
O="--batch-size 8 --seq-len 2048 --device cuda --steps 4 --warmup 1"
run() { local n=$1 b=$2 t=$3; shift 3; local t0=$(date +%s)
  timeout $t $b bench $O "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s"
  grep -E "bench:.*steady|^plan:" $L/$n.log | cut -c1-300
  python3 -c "import json; j=json.load(open('$L/$n.json')); print({k: j[k] for k in j if k in ('host_update_ms','step_ms','uploads_per_step','pinned_bytes','host_rss_bytes','upload_copies')})" 2>/dev/null
  pack; }
HO="--preset olmoe-1b-7b --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16"
timeout 220 gpubin/sf_gpu_tests --gtest_brief=1 > $L/t_all.log 2>&1; echo "tests rc=$?"
grep -E "PASSED|FAILED|SKIPPED|tests ran" $L/t_all.log | head -20; pack
echo "at $(( $(date +%s)-T0 ))s"
# the host AdamW pass alone, 64 Mi elements (memory), the three parameter forms
timeout 60 gpubin/bench_adamw 64 > $L/bench_adamw.log 2>&1; echo "bench_adamw rc=$?"; grep -v '^{' $L/bench_adamw.log; pack
run o_new1 gpubin/slideformer 95 $HO
run o_old1 old/gpubin/slideformer 95 $HO
run o_new2 gpubin/slideformer 95 $HO
run o_old2 old/gpubin/slideformer 95 $HO
echo "at $(( $(date +%s)-T0 ))s"
timeout 130 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm > $L/torch_olmoe.log 2>&1; echo "torch rc=$?"
grep -iE "tok/s" $L/torch_olmoe.log | tail -1; pack
echo "at $(( $(date +%s)-T0 ))s"
