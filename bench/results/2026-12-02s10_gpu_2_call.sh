#!/bin/bash
# session 10 call 2: issue 19 same-call table (ours default = planner's recompute choice, vs torch compiled/eager),
# issue 17 state quality (1B, 500 steps, fp32 vs bf16 state), issue 18 OLMoE vs torch grouped_mm
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
r() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s $(grep -oE '"(tokens_per_second|tokens_per_s)": *[0-9.]*' $L/$n.json | head -1) $(grep -oE '"(mfu|model_tflops_per_second|hardware_tflops_per_second|device_bytes|whole_layers|kept_layers|peak_mem_gib|step_ms)": *[0-9.]*' $L/$n.json | tr '\n' ' ')"; }
O="--batch-size 8 --seq-len 2048 --device cuda --no-offload"
r sf3b_default_a 70 gpubin/slideformer bench --preset llama-3b $O --steps 4 --warmup 1
r torch3b_compiled 120 python3 bench/torch_train_baseline.py --preset 3b --compile --steps 3 --warmup 1
r torch3b_eager 90 python3 bench/torch_train_baseline.py --preset 3b --steps 3 --warmup 1
r sf3b_default_b 70 gpubin/slideformer bench --preset llama-3b $O --steps 4 --warmup 1
r sf1b_default_a 40 gpubin/slideformer bench --preset llama-1b $O --steps 6 --warmup 2
r torch1b_compiled 90 python3 bench/torch_train_baseline.py --preset 1b --compile --steps 3 --warmup 1
r sf1b_default_b 40 gpubin/slideformer bench --preset llama-1b $O --steps 6 --warmup 2
t0=$(date +%s); timeout 260 python3 tools/state_quality.py --bin gpubin/slideformer --device cuda --work /tmp/state_quality > $L/state_quality.log 2>&1
echo "state_quality rc=$? $(( $(date +%s)-t0 ))s"; grep -vE "^\s*$|^\\$|step +[0-9]+/|^\[" $L/state_quality.log | tail -22 | cut -c1-200
r moe_torch_olmoe 120 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 --steps 3 --warmup 1 --experts-impl grouped_mm
r moe_sf_olmoe_24g 120 gpubin/slideformer bench --preset olmoe-1b-7b --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB
grep -h "^plan:\|^bench:" $L/moe_sf_olmoe_24g.log | cut -c1-300
tail -2 $L/moe_torch_olmoe.log | cut -c1-300
tar czf $OUT/logs.tgz -C $OUT logs
