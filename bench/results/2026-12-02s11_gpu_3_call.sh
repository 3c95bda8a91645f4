#!/bin/bash
# session 11 call 3 (budget ~430 s): the persistent sm_90 forward as the shipped one + h5's Gemma 4 CUDA (capped head,
# head dim 512) + h2's set-up: GPU tests, attention speed, OLMoE at 24 GiB (set-up phases), parity (every family)
tar xJf gpupack/bin.tar.xz
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
T0=$(date +%s)
el() { echo $(( $(date +%s)-T0 )); }
s() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-t0 ))s"; }
s gpu_tests 100 gpubin/sf_gpu_tests --gtest_brief=1
grep -E "PASSED|FAILED|SKIPPED" $L/gpu_tests.log | head -12
for hd in 128 64; do timeout 25 gpubin/attn_bench 8 2048 32 8 $hd 2>&1 | grep RESULT | tee -a $L/attn.log; done
tar czf $OUT/logs.tgz -C $OUT logs
r() { local n=$1 t=$2; shift 2; local t0=$(date +%s); timeout $t "$@" > $L/$n.json 2> $L/$n.log; echo "$n rc=$? $(( $(date +%s)-t0 ))s $(grep -oE '"(tokens_per_second|step_ms|predicted_tokens_per_second|setup_s|host_update_ms|gpu_blobs|device_bytes|mfu)": *[0-9.]*' $L/$n.json | tr '\n' ' ')"; grep -h "^plan:\|set-up" $L/$n.log | cut -c1-250 | head -12; }
r olmoe_24g_bf16 115 gpubin/slideformer bench --preset olmoe-1b-7b --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16
tar czf $OUT/logs.tgz -C $OUT logs
s parity_cuda $(( 425 - $(el) )) python3 tools/hf_parity.py --bin gpubin/slideformer --device cuda --work /tmp/parity_cuda
grep -hE "passed, .* failed|^FAIL" $L/parity_cuda.log | head -8 | cut -c1-200
grep -cE "^ok|: ok| ok$" $L/parity_cuda.log
tar czf $OUT/logs.tgz -C $OUT logs
echo total $(el)s
