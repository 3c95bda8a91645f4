#!/bin/bash
# session 11 call 1: merged HEAD's GPU tests and both parity runs (sequential), Gemma 4 reference vs transformers,
# then the 3B all-host step with kept activations (fp32 vs bf16 state) if time remains
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
s gpu_tests 120 gpubin/sf_gpu_tests --gtest_brief=1
grep -E "PASSED|FAILED|SKIPPED" $L/gpu_tests.log | head -12
s parity_cuda 160 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda
grep -hE "passed, .* failed|^FAIL" $L/parity_cuda.log | head -8 | cut -c1-200
s parity_offload 150 python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --cli-args "--offload --slots 2 --gpu-blobs 0" --work /tmp/parity_offload
grep -hE "passed, .* failed|^FAIL" $L/parity_offload.log | head -8 | cut -c1-200
s gemma4_ref 70 python3 tools/gemma4_reference.py --names --binary gpubin/slideformer
grep -vE "^\s*$" $L/gemma4_ref.log | grep -iE "ok|fail|mismatch|max|error|variant|exit" | head -20 | cut -c1-200
tar czf $OUT/logs.tgz -C $OUT logs
r() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s $(grep -oE '"(tokens_per_second|step_ms|predicted_tokens_per_second|whole_layers|kept_layers|gpu_compute_busy_ms|device_bytes)": *[0-9.]*' $L/$n.json | tr '\n' ' ')"; grep -h "^plan:" $L/$n.log | cut -c1-250; }
H="--preset llama-3b --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0"
for st in fp32 bf16; do
  [ $(( $(date +%s)-T0 )) -lt 470 ] && r host_clip1_keep_$st 60 gpubin/slideformer bench $H --max-grad-norm 1 --optimizer-state $st --keep-layers -1 --keep-attention -1
done
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(( $(date +%s)-T0 ))s
