#!/usr/bin/env bash
# Where the 3B step's GPU time goes (issue 19), in one call on the GPU machine: slideformer's
# resident step without and with the op profile (`bench --profile-ops`), the all-host offloaded step
# profiled, optionally an older build's resident step beside it (same machine, for a before/after),
# and PyTorch with compiled layers last.
# Usage there:  OUT=dir bash tools/gpu_profile.sh BIN [BIN_BEFORE]
# Logs: $OUT/<name>.log (stderr: the tables) and $OUT/<name>.json (bench's result line).
set -u
B=$1
A=${2:-}
OUT=${OUT:-/tmp/sf_profile}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
O="--preset llama-3b --batch-size 8 --seq-len 2048 --device cuda --steps 3 --warmup 1"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/summary.txt"
run() {  # name timeout command...
  local name=$1 t=$2
  shift 2
  local t0=$(date +%s)
  timeout "$t" "$@" >"$OUT/$name.json" 2>"$OUT/$name.log"
  local rc=$?
  local tps=$(grep -o '"tokens_per_second": *[0-9.]*' "$OUT/$name.json" | head -1)
  echo "$name rc=$rc $(($(date +%s) - t0))s $tps" | tee -a "$OUT/summary.txt"
}
[ -n "$A" ] && run before_resident 60 "$A/slideformer" bench $O --no-offload
run resident 60 "$B/slideformer" bench $O --no-offload
run resident_profile 60 "$B/slideformer" bench $O --no-offload --profile-ops
run allhost_profile 90 "$B/slideformer" bench $O --offload --gpu-blobs 0 --max-grad-norm 0 --profile-ops
if [ "${TORCH:-1}" = 1 ]; then
  run torch_compiled 100 python3 bench/torch_train_baseline.py --preset 3b --compile --steps 3 --warmup 1
fi
grep -h -A60 "op profile" "$OUT/resident_profile.log" | cut -c1-160
grep -h "sum of ops\|stream " "$OUT/allhost_profile.log"
tail -2 "$OUT/torch_compiled.log" 2>/dev/null
cat "$OUT/summary.txt"
