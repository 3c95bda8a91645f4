#!/usr/bin/env bash
# Every GPU-machine check and benchmark of the repository in one call (device time is scarce).
# Usage there:  BIN=gpubin bash tools/gpu_check.sh [steps...]
#   steps (default all): gpu_tests parity_cpu train_cpu parity_cuda train_cuda demo_cuda bench
#   (also: attn = issue 19's attention parity and speed against torch SDPA's backends, moe = issue 18's mixture-of-experts checks, bench_sf = slideformer's 1B step alone, ncu_rmsnorm = counters of the RMSNorm backward,
#    state_quality state_bench = bf16 optimizer state: quality, 3B speed, 8B plan,
#    parity_offload train_offload bench_offload bench_offload_plan = the sliding engine,
#    bench_host = host rates, plan_hardware = the measured hardware profile with the disk,
#    moe_gemm = issue 18's MoE grouped GEMMs (tests, moe_gemm_bench, the OLMoE op profile), gemma3 = issue 18's Gemma 3 checks, gemma4 = issue 18's Gemma 4 checks, moe_parity / moe_speed and gemma3_parity / gemma3_speed =
#    the two halves of moe and gemma3, moe_parity_offload = the MoE parity through the sliding engine alone, gds = issue 17's GPUDirect Storage checks, profile3b = issue
#    19's op profile of the 3B step, data_throughput = issue 16's data loading beside tokenizers,
#    nvme8 nvme8_k8 nvme13 nvme_levels nvme_wring = the NVMe tier, nvme8_lend = its state read ahead into freed
#    checkpoints (the plan's exact lines, then the 8B bench), bench_adamw = the host AdamW kernel alone,
#    recompute = issue 19's selective recompute: the 3B and 1B resident steps with every layer
#    recomputed, attention kept, and the planner's choice, the op profile of the last;
#    recompute_sliding recompute_sliding_accum = the same in the sliding engine: 3B at 24 GiB with
#    clipping, one micro-batch and four,
#    long_context = issue 19's 8B at 1 x 32768 tokens on 24 GiB and the longest sequence that fits, beside their plans,
#    attn_packed = issue 19's packed rows against unpacked ones with the same attention work, per head dim,
#    moe_gemm = issue 18's MoE grouped GEMMs: the MoE gtests, moe_gemm_bench (per-expert cuBLASLt on 4 streams and
#    on one against the dense ceiling), OLMoE with --profile-ops and the Qwen3-30B-A3B 4-layer cut beside their plans)
# BIN holds slideformer, sf_gpu_tests, bench_kernels, bench_host, bench_adamw, attn_bench and moe_gemm_bench built here with -DSF_PORTABLE=ON.
# Writes $OUT/all.log (every step's output) and $OUT/summary.txt (one line a step).
set -u
BIN=${BIN:-gpubin}
OUT=${OUT:-/tmp/sf_gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(gpu_tests parity_cpu train_cpu parity_cuda train_cuda demo_cuda bench)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a "$OUT/summary.txt"
# The packing benchmarks' data: 3,000 records of 50-800 random token ids (a real-length SFT mix).
sft_mix() {
  python3 -c "
import json, random
random.seed(7)
for i in range(3000):
    n = random.randint(50, 800)
    print(json.dumps({'input_ids': [random.randrange(128000) for _ in range(n)]}))" >/tmp/sft.jsonl
}
run() {
  local name=$1
  shift
  echo "===== $name: $*" >>"$OUT/all.log"
  local t0=$(date +%s)
  "$@" >>"$OUT/all.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(($(date +%s) - t0))s" | tee -a "$OUT/summary.txt"
}
# One `bench` under a time limit: its JSON to $OUT/NAME.json, stderr to all.log, and a summary line
# with the plan beside the measurement (predicted and measured tokens/s, their ratio, the set-up).
bench_vs_plan() {
  local name=$1 limit=$2
  shift 2
  echo "===== $name: bench $*" >>"$OUT/all.log"
  local t0=$(date +%s)
  timeout "$limit" "$BIN/slideformer" bench "$@" >"$OUT/$name.json" 2>>"$OUT/all.log"
  local rc=$?
  local vs=$(python3 -c "
import json, sys
try:
    j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception:
    print('no JSON'); sys.exit()
p, m = j['predicted_tokens_per_second'], j['tokens_per_second']
print(f\"plan {p:.0f} tok/s, measured {m:.0f} tok/s ({m / p if p else 0:.2f} of the plan), \"
      f\"setup {j.get('setup_s', 0):.1f} s, host update {j['host_update_ms']:.0f} ms a step, mfu {j['mfu']}\")" "$OUT/$name.json")
  echo "$name rc=$rc $(($(date +%s) - t0))s $vs" | tee -a "$OUT/summary.txt"
}
MOE_MODELS=qwen3moe_aux,qwen3moe_noaux,mixtral_aux,olmoe_noaux,olmoe_aux,qwen3moe_fused,mixtral_fused_aux
for s in "${steps[@]}"; do
  case $s in
    gpu_tests) run gpu_tests "$BIN/sf_gpu_tests" --gtest_brief=1 ;;
    attn) run attn python3 bench/attn_vs_torch.py "$BIN" ;;  # issue 19: parity + our kernels vs torch SDPA backends (needs $BIN/attn_bench)
    parity_cpu) run parity_cpu python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cpu --work /tmp/parity_cpu ;;
    train_cpu) run train_cpu python3 tools/hf_train_compare.py --bin "$BIN/slideformer" --device cpu --skip-curve --work /tmp/train_cpu ;;
    parity_cuda) run parity_cuda python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda --work /tmp/parity_cuda ;;
    train_cuda) run train_cuda python3 tools/hf_train_compare.py --bin "$BIN/slideformer" --device cuda --work /tmp/train_cuda ;;
    # issue 18, mixture of experts: the kernels, the tiny models against transformers through both
    # engines (cpu and cuda; cuda judged by 2x transformers' own bf16 error, aux loss on and off,
    # per-expert and v5 fused checkpoints), then the speeds: OLMoE-1B-7B at 8 x 2048 beside PyTorch
    # (grouped_mm experts), a 4-layer Qwen3-30B-A3B cut at 24 GiB beside its plan, and the plan of
    # the whole model on a 24 GB / 256 GB desktop. moe = moe_parity + moe_speed.
    # moe_parity_offload alone: the MoE families through the sliding engine on cuda (every blob
    # slides: --gpu-blobs 0), each eval / grad checked to have run on the sliding engine (~90 s).
    moe_parity_offload) run moe_parity_offload timeout 90 python3 tools/hf_parity.py --bin "$BIN/slideformer" \
      --device cuda --models $MOE_MODELS --cli-args "--offload --slots 2 --gpu-blobs 0" --work /tmp/moe_parity_offload ;;
    # issue 18: the MoE grouped GEMMs: their CUDA-vs-CPU tests and dtype refusals, cuBLASLt per expert
    # on 4 streams and on one beside the dense ceiling at the OLMoE and Qwen3 shapes ($BIN/moe_gemm_bench),
    # the OLMoE step's op profile
    moe_gemm) run moe_gemm_tests "$BIN/sf_gpu_tests" --gtest_filter='CudaOps.Moe*:CudaOpsCheck.*' --gtest_brief=1
      run moe_gemm_bench timeout 120 "$BIN/moe_gemm_bench"
      bench_vs_plan moe_gemm_profile_olmoe 90 --preset olmoe-1b-7b --batch-size 8 --seq-len 2048 --steps 3 \
        --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 0 --optimizer-state bf16 --profile-ops
      bench_vs_plan moe_gemm_qwen3_4layers 60 --preset qwen3-30b-a3b --layers 4 --batch-size 8 \
        --seq-len 2048 --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB ;;
    moe|moe_parity|moe_speed)
      if [ "$s" != moe_speed ]; then
      run moe_gpu_tests "$BIN/sf_gpu_tests" --gtest_filter='CudaOps.Moe*' --gtest_brief=1
      run moe_parity_cpu python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cpu --models $MOE_MODELS \
        --work /tmp/moe_parity_cpu
      run moe_parity_cpu_offload python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cpu \
        --models $MOE_MODELS --cli-args "--offload --slots 2" --work /tmp/moe_parity_cpu_off
      run moe_parity_cuda python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda --models $MOE_MODELS \
        --work /tmp/moe_parity_cuda
      run moe_parity_offload python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda --models $MOE_MODELS \
        --cli-args "--offload --slots 2 --gpu-blobs 0" --work /tmp/moe_parity_offload
      fi
      if [ "$s" != moe_parity ]; then
      # (~6 min in all: each run's limit covers its set-up, printed as setup_s, and 4 steps)
      run moe_torch_olmoe timeout 90 python3 bench/torch_train_baseline.py --preset olmoe-1b-7b --batch 8 --seq 2048 \
        --steps 3 --warmup 1 --experts-impl grouped_mm
      # (no clipping: torch_train_baseline's default, the same update work in both)
      O="--preset olmoe-1b-7b --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 0"
      bench_vs_plan moe_bench_olmoe 60 $O
      bench_vs_plan moe_bench_olmoe_bf16 60 $O --optimizer-state bf16
      bench_vs_plan moe_bench_olmoe_k2 70 $O --grad-accum 2
      bench_vs_plan moe_bench_olmoe_k2_bf16 70 $O --grad-accum 2 --optimizer-state bf16
      bench_vs_plan moe_bench_qwen3_4layers 60 --preset qwen3-30b-a3b --layers 4 --batch-size 8 \
        --seq-len 2048 --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB
      mkdir -p /tmp/sf_moe_offload
      run moe_plan_qwen3_desktop "$BIN/slideformer" plan --preset qwen3-30b-a3b --batch-size 8 --seq-len 2048 \
        --hardware rtx4090 --gpu-memory 24GiB --cpu-memory 256GiB --offload-dir /tmp/sf_moe_offload \
        --disk-memory 1TiB
      run moe_plan_qwen3_desktop_bf16 "$BIN/slideformer" plan --preset qwen3-30b-a3b --batch-size 8 --seq-len 2048 \
        --hardware rtx4090 --gpu-memory 24GiB --cpu-memory 256GiB --optimizer-state bf16 --max-grad-norm 0
      fi ;;
    # the sliding (offload) engine: the same parity checks, and the 1B / 3B steps
    parity_offload) run parity_offload python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda \
      --cli-args "--offload --slots 2 --gpu-blobs 0" --no-baseline --work /tmp/parity_offload
      run parity_offload_gpu_blobs python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda \
      --cli-args "--offload --slots 2 --gpu-blobs 3" --no-baseline --work /tmp/parity_offload_gb ;;
    train_offload) run train_offload python3 tools/hf_train_compare.py --bin "$BIN/slideformer" --device cuda \
      --cli-args "--offload --slots 3 --gpu-blobs 2" --work /tmp/train_offload ;;
    # every blob on the host (--gpu-blobs 0): the host path, as measured in session 2
    bench_offload)
      for clip in 1 0; do
        run bench_offload_1b_clip$clip "$BIN/slideformer" bench --preset llama-1b --batch-size 8 --seq-len 2048 \
          --steps 4 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm $clip
        run bench_offload_3b_clip$clip "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
          --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm $clip
      done ;;
    # issue 7: the host path (every blob on the host) and 8B at 24 GiB, next to PyTorch without
    # offload in the same call; peak RSS and the planner's figures are in each JSON line
    offload7_3b)
      run torch_3b python3 bench/torch_train_baseline.py --preset 3b --steps 3 --warmup 2 --clip 1.0
      for clip in 1 0; do
        run sf_3b_host_clip$clip "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
          --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm $clip
      done
      run sf_3b_host_slots2 "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
        --steps 2 --warmup 1 --device cuda --offload --gpu-blobs 0 --slots 2 --max-grad-norm 1 ;;
    # the 3B step without clipping, and the same model resident on the GPU (the GPU-only time)
    offload7_3b_more)
      run sf_3b_host_clip0 "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm 0
      run sf_3b_resident "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --no-offload --max-grad-norm 1 ;;
    # variants of the 3B host path in one call: held gradients on/off (no clipping), clipping,
    # 2 slots in a 6 GiB budget (the planner splits the micro-batches)
    offload7_variants)
      for hold in 0 1; do
        run sf_3b_host_clip0_hold$hold env SF_HOLD_GRADS=$hold "$BIN/slideformer" bench --preset llama-3b \
          --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm 0
      done
      run sf_3b_host_clip1 "$BIN/slideformer" bench --preset llama-3b --batch-size 8 \
        --seq-len 2048 --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm 1
      run sf_3b_host_slots2_6g "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
        --steps 2 --warmup 1 --device cuda --offload --gpu-blobs 0 --slots 2 --gpu-memory 6GiB --max-grad-norm 1 ;;
    # the tokenizer against HF tokenizers on the real files (tmp/tokenizers, `tokenizer_parity.py fetch
    # --gzip`), and HF's ids for the component fixtures of tests/data/tokenizer/rec_*
    tokenizer_hf)
      run tokenizer_compare timeout 200 python3 tools/tokenizer_parity.py compare --bin "$BIN/slideformer" --n 4000 \
        tmp/tokenizers/*.json.gz
      run tokenizer_record timeout 120 python3 tools/tokenizer_parity.py record --out "$OUT/tok" ;;
    # chat records against transformers' apply_chat_template (text, ids, masks) on the real templates
    # (and TRL's training templates where trl is installed), recording the corpus that
    # tests/data/chat_corpus/ holds (copy $OUT/chat_corpus.jsonl there); tmp/tokenizers carried
    # (`tokenizer_parity.py fetch tmp/tokenizers --gzip` and `chat_template_parity.py --fetch`)
    chat_parity) run chat_parity timeout 500 python3 tools/chat_template_parity.py --bin "$BIN/slideformer" \
      --record "$OUT/chat_corpus.jsonl" ;;
    # issue 8 §3: packing on a real-length SFT mix (records of 50-800 tokens) against one record a
    # row, Llama 3.2 1B, --seq-len 2048; tokens trained per second from each step's --metrics line
    pack_bench)
      sft_mix
      run pack_init "$BIN/slideformer" init --config fuzz/corpus/config/llama-3.2-1b.json --output /tmp/m1b --dtype bf16
      for mode in unpacked packed; do
        extra=""; [ $mode = packed ] && extra="--pack"
        rm -rf /tmp/o_$mode
        run pack_$mode "$BIN/slideformer" train --model /tmp/m1b --data /tmp/sft.jsonl --output /tmp/o_$mode --steps 10 \
          --batch-size 8 --seq-len 2048 --lr 1e-5 --device cuda --metrics "$OUT/pack_$mode.jsonl" --no-data-cache $extra
      done
      run pack_summary python3 -c "
import json, sys
for m in ('unpacked', 'packed'):
    rows = [json.loads(l) for l in open('$OUT/pack_' + m + '.jsonl')]
    rows = [r for r in rows if r.get('type') == 'train'][2:]
    tok = sum(r['tokens'] for r in rows); sec = sum(r['tokens'] / r['tokens_per_second'] for r in rows)
    print(m, 'tokens/s', round(tok / sec), 'tokens/step', tok // len(rows), 'loss', rows[-1]['loss'])" ;;
    # packing on the offload engine: Llama 3.2 3B shape (random bf16 weights), every blob on the
    # host, the same 3,000-record mix; then the 1B in-memory pair again (the windowed packer)
    pack_bench3b)
      sft_mix
      python3 -c "
import json
c = json.load(open('fuzz/corpus/config/llama-3.2-1b.json'))
c.update(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, head_dim=128)
json.dump(c, open('/tmp/config3b.json', 'w'))"
      run pack_init3b "$BIN/slideformer" init --config /tmp/config3b.json --output /tmp/m3b --dtype bf16
      run pack_init1b "$BIN/slideformer" init --config fuzz/corpus/config/llama-3.2-1b.json --output /tmp/m1b --dtype bf16
      for m in "3b 8 --offload --gpu-blobs 0" "1b 10"; do
        set -- $m
        size=$1 steps=$2; shift 2
        for mode in unpacked packed; do
          extra=""; [ $mode = packed ] && extra="--pack"
          rm -rf /tmp/o_$mode
          run pack_${size}_$mode "$BIN/slideformer" train --model /tmp/m$size --data /tmp/sft.jsonl --output /tmp/o_$mode \
            --steps $steps --batch-size 8 --seq-len 2048 --lr 1e-5 --device cuda --metrics "$OUT/pack_${size}_$mode.jsonl" \
            --no-data-cache "$@" $extra
        done
        rm -rf /tmp/o_unpacked /tmp/o_packed
      done
      rm -rf /tmp/m3b
      run pack_summary python3 -c "
import json, sys
for s in ('3b', '1b'):
  for m in ('unpacked', 'packed'):
    rows = [json.loads(l) for l in open('$OUT/pack_' + s + '_' + m + '.jsonl')]
    rows = [r for r in rows if r.get('type') == 'train'][2:]
    tok = sum(r['tokens'] for r in rows); sec = sum(r['tokens'] / r['tokens_per_second'] for r in rows)
    print(s, m, 'tokens/s', round(tok / sec), 'tokens/step', tok // len(rows), 's/step', round(sec / len(rows), 3), 'loss', rows[-1]['loss'])" ;;
    # session 4, no trace: bench's steady-state step (intervals between step returns) and its
    # end-to-end figure, 3B split clipping / no clipping / held gradients, 8B at 24 GiB, PyTorch
    offload9)
      run torch_3b python3 bench/torch_train_baseline.py --preset 3b --steps 3 --warmup 2 --clip 1.0
      for v in "clip1 1 0" "clip0 0 0" "clip0_hold 0 1"; do
        set -- $v
        run sf_3b_$1 env SF_HOLD_GRADS=$3 "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
          --steps 5 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm $2
      done
      run sf_3b_slots2_6g "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --slots 2 --gpu-memory 6GiB --max-grad-norm 1
      for clip in 1 0; do
        run sf_8b_24g_clip$clip "$BIN/slideformer" bench --preset llama-8b --batch-size 8 --seq-len 2048 \
          --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm $clip
      done ;;
    # the split update with its moment passes queued after the next forward: 3B clipping with and
    # without a timeline, no clipping as the machine's control, 8B clipping
    offload10)
      b3="$BIN/slideformer bench --preset llama-3b --batch-size 8 --seq-len 2048 --steps 5 --warmup 1 --device cuda
        --offload --gpu-blobs 0"
      mkdir -p "$OUT/traces"
      run sf_3b_clip1_trace env SF_TRACE="$OUT/traces/clip1.jsonl" $b3 --max-grad-norm 1
      run trace_3b_clip1 python3 tools/trace_summary.py "$OUT/traces/clip1.jsonl" --layers
      run sf_3b_clip1 $b3 --max-grad-norm 1
      run sf_3b_clip0 $b3 --max-grad-norm 0
      run sf_8b_24g_clip1 "$BIN/slideformer" bench --preset llama-8b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1
      tar czf "$OUT/traces.tgz" -C "$OUT" traces && rm -rf "$OUT/traces" ;;
    # issue 8 §4: an output directory loads with AutoModelForCausalLM / AutoTokenizer, generation_config kept
    hf_load) run hf_load python3 tools/hf_load_check.py --bin "$BIN/slideformer" --device cuda ;;
    # session 5, final code (host AdamW with software prefetch, 2048 elements by default): 3B clip
    # with longer distances, 3B no clip, the 6 GiB split run, 8B at 24 GiB
    offload14)
      run torch_3b python3 bench/torch_train_baseline.py --preset 3b --steps 3 --warmup 2 --clip 1.0
      b3="$BIN/slideformer bench --preset llama-3b --batch-size 8 --seq-len 2048 --steps 5 --warmup 1 --device cuda
        --offload --gpu-blobs 0"
      run sf_3b_clip1 $b3 --max-grad-norm 1
      run sf_3b_clip0 $b3 --max-grad-norm 0
      run sf_3b_slots2_6g $b3 --slots 2 --gpu-memory 6GiB --max-grad-norm 1
      for clip in 1 0; do
        run sf_8b_24g_clip$clip "$BIN/slideformer" bench --preset llama-8b --batch-size 8 --seq-len 2048 \
          --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm $clip
      done ;;
    # issue 10's same-call check: the refactored build ($BIN) against the one before it ($BASE),
    # alternated (base, new, base, new) so that drift shows: the 1B step in GPU memory and the 3B
    # offload step (every blob on the host, clipping)
    same_call)
      for round in 1 2; do
        for which in base new; do
          b="$BIN"; [ $which = base ] && b="$BASE"
          run ${which}_1b_r$round "$b/slideformer" bench --preset llama-1b --batch-size 8 --seq-len 2048 \
            --steps 10 --warmup 2 --device cuda
          run ${which}_3b_r$round "$b/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
            --steps 5 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm 1
        done
      done ;;
    # the tokenizers next to Hugging Face's encode_batch (BIN holds a portable CPU-only sf_tests;
    # the real files in tmp/tokenizers, carried)
    tokenizer_speed) run tokenizer_speed bash tools/tokenizer_speed.sh "${SF_CPU_BIN:-$BIN/cpu}" ;;
    # issue 16: data throughput beside tokenizers' encode_batch on the same ~20 MB (text,
    # prompt/completion, chat): `tokenize --jsonl` and train's data loading, all cores; the
    # tokenizers from tmp/tokenizers (tools/tokenizer_parity.py fetch --gzip, carried)
    data_throughput)
      run data_throughput_llama3 python3 tools/data_throughput.py --bin "$BIN/slideformer" \
        --tokenizer tmp/tokenizers/llama3.json.gz --template tests/data/chat_templates/llama3.1.jinja --work /tmp/data_tp_llama3
      run data_throughput_qwen3 python3 tools/data_throughput.py --bin "$BIN/slideformer" \
        --tokenizer tmp/tokenizers/qwen3.json.gz --template tests/data/chat_templates/qwen3.jinja --work /tmp/data_tp_qwen3 ;;
    offload7_8b)
      for clip in 1 0; do
        run sf_8b_24g_clip$clip "$BIN/slideformer" bench --preset llama-8b --batch-size 8 --seq-len 2048 \
          --steps 2 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm $clip
      done
      run sf_8b_24g_accum4 "$BIN/slideformer" bench --preset llama-8b --batch-size 8 --seq-len 2048 \
        --grad-accum 4 --steps 2 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1 ;;
    # the planner's choice: 3B with a 20 GiB GPU budget (some blobs kept on the GPU), and 8B
    bench_offload_plan)
      run bench_offload_3b_20g "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --gpu-memory 20GiB
      run bench_8b "$BIN/slideformer" bench --preset llama-8b --batch-size 8 --seq-len 2048 --steps 3 --warmup 1 \
        --device cuda ;;
    # the 3B offload step with 8 host threads (the host copy bandwidth peaked at 8 in bench_host)
    bench_offload_t8)
      for clip in 1 0; do
        run bench_offload_3b_t8_clip$clip env SF_THREADS=8 "$BIN/slideformer" bench --preset llama-3b --batch-size 8 \
          --seq-len 2048 --steps 3 --warmup 1 --device cuda --offload --max-grad-norm $clip
      done ;;
    # this machine's rates as the planner measures them, and its prediction for the 3B host path
    plan_measure) run plan_measure "$BIN/slideformer" plan --preset llama-3b --batch-size 8 --seq-len 2048 --device cuda \
      --offload --gpu-blobs 0 --measure ;;
    # issue 17 §2, compact optimizer state (--optimizer-state bf16). Quality: a 1B model trained 500
    # steps on the Python and documentation text Debian ships, fp32 vs bf16 AdamW m and v, eval loss
    # within 1 % at every 50-step evaluation (tools/state_quality.py; --cli-args places the engine)
    state_quality) run state_quality python3 tools/state_quality.py --bin "$BIN/slideformer" --device cuda \
      --work /tmp/state_quality ;;
    # speed: the 3B step with every blob on the host, clip 1, fp32 then bf16 state in the same call
    # (target: bf16 >= 1.15x fp32, >= 16,000 tok/s); plan: 8B at 24 GiB with bf16 state, host bytes
    # a parameter without the checkpoints (target <= 9)
    # issue 17 §1, the NVMe tier on this machine's disk (the offload file in /tmp/sf_off, removed
    # with the process): 8B at 24 GiB of GPU and 64 GiB of host memory with fp32 state, clip 1.0 (and
    # the plans for --grad-accum 8, fp32 and bf16 state); each bench line carries the disk's bytes
    # a step, its busy time and the plan's disk time
    nvme8)
      mkdir -p /tmp/sf_off
      for st in fp32 bf16; do
        run nvme_plan_8b_k8_$st "$BIN/slideformer" plan --preset llama-8b --batch-size 8 --seq-len 2048 --grad-accum 8 \
          --device cuda --gpu-memory 24GiB --cpu-memory 64GiB --offload-dir /tmp/sf_off --optimizer-state $st
      done
      run nvme_8b_64g "$BIN/slideformer" bench --preset llama-8b --batch-size 8 --seq-len 2048 --steps 2 --warmup 1 \
        --device cuda --gpu-memory 24GiB --cpu-memory 64GiB --offload-dir /tmp/sf_off --max-grad-norm 1 ;;
    # issue 17 §1, GPUDirect Storage: the cuFile tests (bytes disk <-> GPU; a sliding engine with its
    # checkpoints through cuFile against the io_uring + pinned bounce path), then 1B with a host budget
    # that puts checkpoints on the disk (the plan must say so and name the path), benched through
    # cuFile and with SF_CUFILE=0 (each bench line: disk_io, disk_cufile_bytes_per_step, disk_busy_ms)
    gds)
      mkdir -p /tmp/sf_gds
      ls -l /usr/local/cuda/lib64/libcufile.so* /proc/driver/nvidia-fs 2>&1 | tee -a "$OUT/all.log" | head -5
      run gds_tests "$BIN/sf_gpu_tests" --gtest_filter='Gds.*'
      # 11 GiB of host memory: every layer's AdamW state and 10 layers' checkpoints on the disk (planned here)
      GDS_ARGS="--preset llama-1b --batch-size 8 --seq-len 2048 --device cuda --gpu-memory 24GiB --offload --gpu-blobs 0 --cpu-memory ${GDS_CPU_MEMORY:-11GiB} --offload-dir /tmp/sf_gds --max-grad-norm 1"
      "$BIN/slideformer" plan $GDS_ARGS >"$OUT/gds_plan.json" 2>>"$OUT/all.log"
      run gds_plan python3 -c "
import json, sys
p = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][-1]
print(json.dumps({k: p[k] for k in ('fits', 'ckpt_disk_layers', 'disk_blobs', 'checkpoint_io', 'predicted_tokens_per_second')}))
sys.exit(0 if p['fits'] and p['ckpt_disk_layers'] > 0 and p['checkpoint_io'].startswith('cuFile') else 1)" "$OUT/gds_plan.json"
      run gds_bench_cufile "$BIN/slideformer" bench $GDS_ARGS --steps 3 --warmup 1
      run gds_bench_bounce env SF_CUFILE=0 "$BIN/slideformer" bench $GDS_ARGS --steps 3 --warmup 1 ;;
    # the same 8B with --grad-accum 8 and bf16 state (state of every layer and the held gradients of
    # 20 on the disk): the plan's phases (forward / head / backward, each with its bound) against the
    # step and against the timeline's phases (issue 17: within 15 %). The plan with this machine's
    # measured rates first (bench predicts with the built-in ones), then bench with SF_TRACE; the
    # trace's `head` column is the forward's end, `bwd0` the backward's.
    nvme8_k8)
      mkdir -p /tmp/sf_off "$OUT/traces"
      run nvme_plan_8b_k8_bf16_profile "$BIN/slideformer" plan --preset llama-8b --batch-size 8 --seq-len 2048 \
        --grad-accum 8 --gpu-memory 24GiB --cpu-memory 64GiB --offload-dir /tmp/sf_off --max-grad-norm 1 \
        --optimizer-state bf16 --hardware bench/results/2026-12-01s7_h200_profile.json
      run nvme_8b_64g_k8_bf16 env SF_TRACE="$OUT/traces/nvme8_k8.jsonl" "$BIN/slideformer" bench --preset llama-8b \
        --batch-size 8 --seq-len 2048 --steps 2 --warmup 1 --device cuda --gpu-memory 24GiB --cpu-memory 64GiB \
        --offload-dir /tmp/sf_off --max-grad-norm 1 --grad-accum 8 --optimizer-state bf16
      run nvme_8b_64g_k8_bf16_phases python3 tools/trace_summary.py "$OUT/traces/nvme8_k8.jsonl" ;;
    # the state ring's read-ahead into the checkpoints the backward freed (docs/ENGINE.md "Read-ahead
    # into freed checkpoints"): the 8B of nvme8_k8. The plan on the H200's measured profile must say
    # exactly the three lines below (10.96 GiB moved out of the forward: 28.991 s -> 23.422 s, 3,295 ->
    # 3,831 tokens/s); then one bench with SF_TRACE (~3 min): its JSON's disk_lent_pieces_per_step
    # must be > 0, and its step and the trace's phases go beside the plan's (session 7's code: 2,644).
    nvme8_lend)
      mkdir -p /tmp/sf_off "$OUT/traces"
      "$BIN/slideformer" plan --preset llama-8b --batch-size 8 --seq-len 2048 --grad-accum 8 --gpu-memory 24GiB \
        --cpu-memory 64GiB --offload-dir /tmp/sf_off --max-grad-norm 1 --optimizer-state bf16 \
        --hardware bench/results/2026-12-01s7_h200_profile.json >/dev/null 2>"$OUT/nvme8_lend_plan.txt"
      cat "$OUT/nvme8_lend_plan.txt" >>"$OUT/all.log"
      run nvme8_lend_plan_lines bash -c 'f=$1; rc=0; for l in \
        "read ahead into the checkpoints the backward freed: 10.96 GiB of AdamW state (room for 15.09 GiB)" \
        "predicted (lower bound from the rates): 34.210 s a step, 3831 tokens/s (GPU 14.382 s, host 1.462 s, PCIe 1.861 s, disk 33.311 s)" \
        "phases: forward 23.422 s (disk), head 0.769 s (GPU), backward 10.019 s (GPU); the step: their sum"; do
        grep -qxF "$l" "$f" && echo "ok: $l" || { echo "MISSING: $l"; rc=1; }; done; exit $rc' _ "$OUT/nvme8_lend_plan.txt"
      run nvme8_lend_bench env SF_TRACE="$OUT/traces/nvme8_lend.jsonl" "$BIN/slideformer" bench --preset llama-8b \
        --batch-size 8 --seq-len 2048 --steps 2 --warmup 1 --device cuda --gpu-memory 24GiB --cpu-memory 64GiB \
        --offload-dir /tmp/sf_off --max-grad-norm 1 --grad-accum 8 --optimizer-state bf16
      run nvme8_lend_pieces python3 -c "
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{') and 'disk_lent_pieces_per_step' in l]
r = rows[-1]
print(json.dumps({k: r.get(k) for k in ('tokens_per_second', 'step_ms', 'predicted_step_ms', 'disk_lent_pieces_per_step', 'predicted_lent_read_bytes', 'disk_busy_ms', 'predicted_phases')}))
sys.exit(0 if r['disk_lent_pieces_per_step'] > 0 else 1)" "$OUT/all.log"
      run nvme8_lend_phases python3 tools/trace_summary.py "$OUT/traces/nvme8_lend.jsonl" --layers
      # The verdict (issue 17: tokens/s as the plan predicts, within 15 %), and where the measured step
      # went against the plan's phases: the forward's end after the previous step's last update
      # (session 12 found 3.8 s there: the forward stalled behind reclaims), the backward's length.
      run nvme8_lend_verdict python3 tools/nvme8_verdict.py "$OUT/all.log" "$OUT/traces/nvme8_lend.jsonl" ;;
    # the host AdamW kernel alone on this machine's cores: fp32 vs bf16 state, fused and split passes,
    # 1 Mi (cache) and 64 Mi (memory) elements, all cores and one
    bench_adamw)
      run bench_adamw_all "$BIN/bench_adamw" 1 64
      SF_THREADS=1 run bench_adamw_1 "$BIN/bench_adamw" 1 64 ;;
    # 13B (Llama 2) with bf16 state at 24 GiB and the default host budget, state spilling to the disk
    nvme13)
      mkdir -p /tmp/sf_off
      run nvme_13b_bf16 "$BIN/slideformer" bench --preset llama-13b --batch-size 8 --seq-len 2048 --steps 2 --warmup 1 \
        --device cuda --gpu-memory 24GiB --offload-dir /tmp/sf_off --max-grad-norm 1 --optimizer-state bf16 ;;
    # issue 17 §1, levels 2-5 of the NVMe tier (held gradients, fp32 masters, working copies in the
    # offload file): 3B, bf16 state, every blob on the host, 12 GiB of host memory (all five levels:
    # the working copies of 8 layers read for each upload) and 16 GiB (masters of 9 layers, their
    # working copies in RAM); the step's disk bytes and time against the plan's disk line
    nvme_levels)
      mkdir -p /tmp/sf_off
      for m in 12 16; do
        run nvme_levels_plan_3b_${m}g "$BIN/slideformer" plan --preset llama-3b --batch-size 8 --seq-len 2048 \
          --device cuda --offload --gpu-blobs 0 --gpu-memory 24GiB --cpu-memory ${m}GiB --offload-dir /tmp/sf_off \
          --disk-memory 60GiB --optimizer-state bf16 --max-grad-norm 1
        run nvme_levels_3b_${m}g "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 --steps 2 \
          --warmup 1 --device cuda --offload --gpu-blobs 0 --gpu-memory 24GiB --cpu-memory ${m}GiB \
          --offload-dir /tmp/sf_off --disk-memory 60GiB --optimizer-state bf16 --max-grad-norm 1
      done ;;
    # the working copies' ring in pieces (level 5 read 2 x 64 MiB at a time, each piece's H2D copy
    # after its read): 3B at 10 GiB of host memory, where the plan puts working copies in the file
    # (checked), then the bench (its disk bytes and time against the plan's)
    nvme_wring)
      mkdir -p /tmp/sf_off
      WRING_ARGS="--preset llama-3b --batch-size 8 --seq-len 2048 --device cuda --offload --gpu-blobs 0 --gpu-memory 24GiB --cpu-memory ${WRING_CPU_MEMORY:-10GiB} --offload-dir /tmp/sf_off --disk-memory 60GiB --optimizer-state bf16 --max-grad-norm 1"
      "$BIN/slideformer" plan $WRING_ARGS >"$OUT/wring_plan.json" 2>>"$OUT/all.log"
      run nvme_wring_plan python3 -c "
import json, sys
p = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][-1]
ring = [i for i in p['items'] if i['name'].startswith('working copies read from the offload dir')]
print(json.dumps({'fits': p['fits'], 'disk_weights': len(p['disk_weights']), 'ring': ring, 'tok_s': p['predicted_tokens_per_second']}))
sys.exit(0 if p['fits'] and p['disk_weights'] and ring and 'pieces' in ring[0]['name'] else 1)" "$OUT/wring_plan.json"
      run nvme_wring_3b "$BIN/slideformer" bench $WRING_ARGS --steps 2 --warmup 1 ;;
    # issues 17 and 19: the 3B all-host step with the sliding engine's kept activations asked for
    # (the planner's choice: with every blob on the host the GPU has room for whole layers). With
    # clipping the step is about the backward plus the parameter passes (20 B a parameter of host
    # traffic with fp32 state, 16 with bf16): a shorter backward raises the bf16/fp32 ratio (target
    # 1.15x); without clipping the target is >= 18,500 tokens/s. Two runs of each, same call.
    # Plans with the session-7 H200 profile (session 10): clip 1 fp32 keeps nothing, 13,806 tokens/s
    # (the backward host-bound); bf16 keeps 25 layers whole, 17,993 (1.30x); no clip fp32 nothing,
    # 15,123; bf16 10 whole + 18 attention, 19,517. ~6 min.
    allhost_keep)
      for rep in 1 2; do
        for st in fp32 bf16; do
          run sf_3b_host_clip1_keep_${st}_$rep "$BIN/slideformer" bench --preset llama-3b --batch-size 8 \
            --seq-len 2048 --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm 1 \
            --optimizer-state $st --keep-layers -1 --keep-attention -1
        done
        for keep in 0 -1; do
          run sf_3b_host_clip0_keep${keep}_$rep "$BIN/slideformer" bench --preset llama-3b --batch-size 8 \
            --seq-len 2048 --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm 0 \
            --keep-layers $keep --keep-attention $keep
        done
      done ;;
    state_bench)
      for st in fp32 bf16; do
        run sf_3b_host_clip1_state_$st "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
          --steps 3 --warmup 1 --device cuda --offload --gpu-blobs 0 --max-grad-norm 1 --optimizer-state $st
      done
      for st in fp32 bf16; do
        "$BIN/slideformer" plan --preset llama-8b --batch-size 8 --seq-len 2048 --device cuda --gpu-memory 24GiB \
          --optimizer-state $st >"$OUT/plan_8b_24g_$st.json" 2>>"$OUT/all.log"
        run plan_8b_24g_state_$st python3 -c "
import json, sys
p = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][-1]
host = sum(i['bytes'] for i in p['items'] if i['place'] in ('host', 'pinned'))
ckpt = sum(i['bytes'] for i in p['items'] if i['place'] in ('host', 'pinned') and 'checkpoint' in i['name'])
per = (host - ckpt) / p['parameters']
print(json.dumps({'plan_8b_24g': p['optimizer_state'], 'fits': p['fits'], 'host_bytes': host, 'checkpoint_bytes': ckpt,
                  'host_bytes_per_param_without_checkpoints': per, 'predicted_tokens_per_second': p['predicted_tokens_per_second']}))
sys.exit(0 if p['fits'] and (p['optimizer_state'] == 'fp32' or per <= 9) else 1)" "$OUT/plan_8b_24g_$st.json"
      done ;;
    # issue 17: this machine's figures with its disk (O_DIRECT, 64 MiB blocks, 4 in flight) saved as a
    # hardware profile ($OUT/h200.json comes back), then a plan from that file
    plan_hardware)
      mkdir -p /tmp/sf_probe && rm -f "$OUT/h200.json"
      run plan_hardware_measure "$BIN/slideformer" plan --preset llama-8b --batch-size 8 --seq-len 2048 --device cuda \
        --gpu-memory 24GiB --measure --offload-dir /tmp/sf_probe --save-hardware "$OUT/h200.json"
      run plan_hardware_file "$BIN/slideformer" plan --preset llama-8b --batch-size 8 --seq-len 2048 \
        --gpu-memory 24GiB --hardware "$OUT/h200.json" ;;
    # the tokenizer against Hugging Face tokenizers (any machine that has them)
    tokenizer_parity) run tokenizer_parity python3 tools/tokenizer_parity.py --bin "$BIN/slideformer" ;;
    # host memory bandwidth, CPU AdamW rate, PCIe: the rates that bound the offload engine
    bench_host) run bench_host "$BIN/bench_host" 2048 ;;
    # issue 19: where the 3B step's GPU time goes, op by op (resident and all-host), beside PyTorch
    # with compiled layers; the tables land in $OUT/profile/*.log (tools/gpu_profile.sh)
    profile3b) run profile3b env OUT="$OUT/profile" bash tools/gpu_profile.sh "$BIN" ;;
    # issue 19: selective recompute (docs/ENGINE.md "Selective recompute"). The 3B resident step
    # with every layer recomputed (--keep-layers 0 --keep-attention 0: the path before it),
    # attention kept in every layer (saves 28 attention forwards, 5.8 TFLOP a step), the planner's
    # choice (on the H200: every layer kept whole, no recompute: 75.0 of the step's 411 TFLOP); then the
    # planner's choice op-profiled (attention forward calls 28 instead of 56, the GEMMs' share), and
    # the 1B step without and with. Each log's plan line says how many layers kept what. First the
    # GPU test (tests/gpu/test_cuda_selective_recompute.cpp: gradients against the recompute path).
    recompute)
      run recompute_gpu_test "$BIN/sf_gpu_tests" --gtest_filter='CudaSelectiveRecompute*'
      for k in "none:--keep-layers 0 --keep-attention 0" "attention:--keep-layers 0 --keep-attention -1" "planner:--keep-layers -1 --keep-attention -1"; do
        run sf_3b_keep_${k%%:*} "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
          --steps 4 --warmup 1 --device cuda --no-offload ${k#*:}
      done
      run sf_3b_keep_planner_profile "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --no-offload --profile-ops --keep-layers -1 --keep-attention -1
      for k in "none:--keep-layers 0 --keep-attention 0" "planner:--keep-layers -1 --keep-attention -1"; do
        run sf_1b_keep_${k%%:*} "$BIN/slideformer" bench --preset llama-1b --batch-size 8 --seq-len 2048 \
          --steps 6 --warmup 2 --device cuda --no-offload ${k#*:}
      done ;;
    # issue 19: selective recompute in the sliding engine. First its GPU test (the kept path's
    # gradients against its recompute path, blobs sliding and on the GPU); then the 3B step at
    # 24 GiB with clipping: every layer recomputed (0/0), the planner's choice (-1/-1: the plan
    # line says what it kept; with the H200's default rates it predicts no gain at one micro-batch,
    # the blobs on the GPU being worth more, so this run repeats 0/0), attention kept in all 28
    # layers and 3 layers kept whole (blobs on the GPU fill the rest in both). ~2-3 min.
    recompute_sliding)
      run recompute_sliding_gpu_test "$BIN/sf_gpu_tests" --gtest_filter='CudaSelectiveRecompute.Sliding*'
      for k in "none:0 0" "planner:-1 -1" "attention:0 28" "whole3:3 0"; do
        set -- ${k#*:}
        run sf_3b_24g_keep_${k%%:*} "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
          --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1 --keep-layers $1 --keep-attention $2
      done ;;
    # ... with 4 micro-batches a step (GPU-bound in the prediction: the planner keeps attention in
    # all 28 layers for every micro-batch, 10.7 GiB, and only the embedding and the head on the GPU,
    # +2.1 % predicted). ~1.5 min.
    recompute_sliding_accum)
      for k in "none:0 0" "planner:-1 -1"; do
        set -- ${k#*:}
        run sf_3b_24g_k4_keep_${k%%:*} "$BIN/slideformer" bench --preset llama-3b --batch-size 8 --seq-len 2048 \
          --grad-accum 4 --steps 2 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1 \
          --keep-layers $1 --keep-attention $2
      done ;;
    # issue 19, long context (~4 min): 8B at 1 x 32768 tokens on 24 GiB beside its plans (built-in
    # rates; this machine's measured ones, whose attention rate plan --measure times at 2 x 8192, saved
    # to $OUT/h200_long.json), our attention kernel at that length, then the longest sequence that
    # fits 24 GiB (plan --longest-seq: with fp32 state the host's 128 GiB decide, with bf16 state
    # the GPU's 24 GiB) benched with bf16 state; each bench line carries its plan's prediction.
    long_context)
      L8="--preset llama-8b --batch-size 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1"
      rm -f "$OUT/h200_long.json"
      run long_plan_measure "$BIN/slideformer" plan $L8 --seq-len 32768 --measure --save-hardware "$OUT/h200_long.json"
      run long_attn_32k "$BIN/attn_bench" 1 32768 32 8 128
      run long_bench_32k "$BIN/slideformer" bench $L8 --seq-len 32768 --steps 2 --warmup 1
      for st in fp32 bf16; do
        run long_plan_longest_$st "$BIN/slideformer" plan $L8 --longest-seq --optimizer-state $st
        "$BIN/slideformer" plan $L8 --longest-seq --optimizer-state $st 2>/dev/null >"$OUT/longest_$st.json"
      done
      n=$(python3 -c "
import json, sys
print([json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')][-1]['longest_seq_len'])" "$OUT/longest_bf16.json")
      echo "longest sequence that fits 24 GiB (bf16 state): $n" | tee -a "$OUT/summary.txt"
      run long_bench_longest_bf16 "$BIN/slideformer" bench $L8 --seq-len "$n" --optimizer-state bf16 --steps 2 \
        --warmup 0 ;;
    bench_sf) run bench_sf "$BIN/slideformer" bench --preset llama-1b --batch-size 8 --seq-len 2048 --steps 6 --warmup 2 --device cuda ;;
    # hardware counters of the RMSNorm backward (Firecracker machines only)
    ncu_rmsnorm) run ncu_rmsnorm ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy -k regex:rmsnorm_bwd --launch-count 1 "$BIN/bench_kernels" mem ;;
    demo_cuda) run demo_cuda "$BIN/slideformer" demo --device cuda --output /tmp/sf_demo_cuda ;;
    # kernels and the 1B training step, each against PyTorch in the same run, then the targets table
    bench) run bench bash bench/run_all.sh "$BIN" "$OUT/bench.log" ;;
    # issue 18, Gemma 3: its kernels (GeGLU, (1 + w) RMSNorm, sliding-window attention, head dim 256),
    # the two tiny Gemma models against transformers through the resident and the sliding engine (cpu
    # and cuda), and the 4B shape resident and offloaded at 24 GiB
    # issue 18, Gemma 3: kernels, the tiny models (head dim 256 and 64, windows 16 and 7 < the
    # sequence 45) against transformers through both engines (cuda judged by 2x transformers' own
    # bf16 error), then the 4B shape resident and offloaded. gemma3 = gemma3_parity + gemma3_speed.
    gemma3|gemma3_parity|gemma3_speed)
      if [ "$s" != gemma3_speed ]; then
      run gemma3_gpu_tests "$BIN/sf_gpu_tests" --gtest_brief=1 \
        --gtest_filter='CudaOps.Attention*:CudaOps.GeGlu:CudaOps.SwiGlu:CudaOps.RmsNorm*'
      g3=gemma3_hd256,gemma3_small
      run gemma3_parity_cpu python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cpu --models $g3 \
        --work /tmp/g3_parity_cpu
      run gemma3_parity_cpu_offload python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cpu --models $g3 \
        --cli-args "--offload --slots 2" --work /tmp/g3_parity_cpu_off
      run gemma3_parity_cuda python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda --models $g3 \
        --work /tmp/g3_parity_cuda
      run gemma3_parity_cuda_offload python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda --models $g3 \
        --cli-args "--offload --slots 2 --gpu-blobs 0" --work /tmp/g3_parity_cuda_off
      fi
      if [ "$s" != gemma3_parity ]; then
      # 8 x 2048 beside PyTorch without offload (Gemma3ForCausalLM of the same shape, SDPA, checkpointing)
      run gemma3_4b_torch timeout 150 python3 bench/torch_train_baseline.py --preset gemma3-4b --batch 8 --seq 2048 \
        --steps 3 --warmup 1 --clip 1.0
      bench_vs_plan gemma3_4b_resident 120 --preset gemma3-4b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --max-grad-norm 1
      bench_vs_plan gemma3_4b_offload 120 --preset gemma3-4b --batch-size 8 --seq-len 2048 \
        --steps 3 --warmup 1 --device cuda --gpu-memory 24GiB --max-grad-norm 1
      fi ;;
    # issue 18, Gemma 4 (docs/GEMMA4.md): the capped head, head dim 512 attention and the MoE
    # block's per-expert scale kernels against their CPU twins; tools/gemma4_reference.py (its torch
    # math vs transformers' Gemma4ForCausalLM, loss / logits / every gradient; slideformer loads every
    # saved config: dense, K/V-shared, PLE, MoE); the tiny models against transformers through the
    # resident and the sliding engine, cpu and cuda.
    gemma4)
      run gemma4_gpu_tests "$BIN/sf_gpu_tests" --gtest_brief=1 \
        --gtest_filter='CudaOps.AttentionHeadDim512:CudaOps.LinearCrossEntropy*:CudaOps.MoeExpertScale'
      run gemma4_reference python3 tools/gemma4_reference.py --binary "$BIN/slideformer"
      # Each model through each engine and device once where it tells something new (run time):
      # fp32 models on the cpu (tight tolerances), the 512-wide bf16 one, K/V sharing, PLE and the
      # MoE block on cuda, the sliding engine with K/V sharing, PLE and MoE on the cpu and with the
      # 512-wide heads on cuda.
      run gemma4_parity_cpu python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cpu \
        --models gemma4_dense_fp32,gemma4_kvshared,gemma4_ple,gemma4_moe --work /tmp/g4_parity_cpu
      run gemma4_parity_cpu_offload python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cpu \
        --models gemma4_kvshared,gemma4_ple,gemma4_moe --cli-args "--offload --slots 2" --work /tmp/g4_parity_cpu_off
      run gemma4_parity_cuda python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda \
        --models gemma4_dense,gemma4_kvshared,gemma4_ple,gemma4_moe --work /tmp/g4_parity_cuda
      run gemma4_parity_cuda_offload python3 tools/hf_parity.py --bin "$BIN/slideformer" --device cuda \
        --models gemma4_dense --cli-args "--offload --slots 2 --gpu-blobs 0" --work /tmp/g4_parity_cuda_off ;;
    # issue 19, packed rows at the speed per real token of unpacked ones (attn_packed, ~2.5 min):
    # the attention gtests (CPU twin: packed rows with odd records, records across tiles,
    # one-token records, windows, pos only 4-byte aligned, each kernel path), then per head dim
    # B 8 x T 2048 packed in records of 512 against B 32 x T 512 unpacked (the same tiles),
    # alternated twice, and records of 2048 (one a row: the bounded kernels on the plain causal
    # work) against B 8 x T 2048 unpacked; the ratios (unpacked / packed, 1.0 = the same speed)
    # into the summary. What a gap is made of: B 32 x T 512 in records of 512 (the bounded kernels
    # in the unpacked rows' tile order) against B 32 x T 512 unpacked (bounded_512: the kernels'
    # own cost) and against B 8 x T 2048 in records of 512 (order_512: the order, and blocks of one
    # record running at once).
    attn_packed)
      run attn_packed_gtests timeout 300 "$BIN/sf_gpu_tests" \
        --gtest_filter='CudaOps.Attention*:-CudaOps.AttentionHeadDim256:CudaOps.AttentionHeadDim512' --gtest_brief=1
      for hd in 128 64; do
        for i in 1 2; do
          for a in "8 2048 32 8 $hd --pack 512" "32 512 32 8 $hd"; do
            timeout 30 "$BIN/attn_bench" $a 2>&1 | tee -a "$OUT/all.log" | grep RESULT | tee -a "$OUT/summary.txt"
          done
        done
        for a in "8 2048 32 8 $hd --pack 2048" "8 2048 32 8 $hd" "32 512 32 8 $hd --pack 512"; do
          timeout 30 "$BIN/attn_bench" $a 2>&1 | tee -a "$OUT/all.log" | grep RESULT | tee -a "$OUT/summary.txt"
        done
      done
      python3 - "$OUT/summary.txt" <<'PY' | tee -a "$OUT/summary.txt"
import re, sys
runs = {}  # (hd, B, T, pack) -> [(fwd, bwd, fwdbwd), ...]
for line in open(sys.argv[1]):
    m = re.match(r"RESULT sf_attn path=auto B=(\d+) T=(\d+) .* hd=(\d+) pack=(\d+) window=0 "
                 r"fwd_ms=([\d.]+) bwd_ms=([\d.]+) fwdbwd_ms=([\d.]+)", line)
    if m:
        B, T, hd, pack = (int(x) for x in m.groups()[:4])
        runs.setdefault((hd, B, T, pack), []).append(tuple(float(x) for x in m.groups()[4:]))
for hd in (128, 64):
    for name, packed, plain in (("records_512", (hd, 8, 2048, 512), (hd, 32, 512, 0)),
                                ("records_2048", (hd, 8, 2048, 2048), (hd, 8, 2048, 0)),
                                ("bounded_512", (hd, 32, 512, 512), (hd, 32, 512, 0)),
                                ("order_512", (hd, 8, 2048, 512), (hd, 32, 512, 512))):
        p, u = runs.get(packed, [])[-2:], runs.get(plain, [])[-2:]
        n = min(len(p), len(u))  # this step's last runs, paired in order
        p, u = p[-n:], u[-n:]
        if n:
            r = [[u[i][k] / p[i][k] for i in range(len(p))] for k in range(3)]
            print(f"RESULT attn_hd{hd}_packed_{name}_per_token fwd=" + "/".join(f"{x:.3f}" for x in r[0]) +
                  " bwd=" + "/".join(f"{x:.3f}" for x in r[1]) + " fwdbwd=" + "/".join(f"{x:.3f}" for x in r[2]))
PY
      ;;
    *) echo "unknown step $s" ;;
  esac
done
grep -E "tokens_per_second|tok/s|PASS|FAIL|passed|failed|accuracy_after|met|MISSED" "$OUT/all.log" | tail -n 60
