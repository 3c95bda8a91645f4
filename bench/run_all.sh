#!/usr/bin/env bash
# The issue-3 benchmarks, slideformer and its PyTorch reference side by side in one run, then the
# targets table (bench/compare.py). Usage on the GPU machine: bench/run_all.sh BIN_DIR LOG
#   BIN_DIR holds slideformer and bench_kernels; LOG receives everything.
set -u
BIN=${1:-build}
LOG=${2:-bench_all.log}
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$BIN/bench_kernels"
  python3 "$(dirname "$0")/torch_kernels.py"
  "$BIN/slideformer" bench --preset llama-1b --batch-size 8 --seq-len 2048 --steps 6 --warmup 2 --device cuda
  python3 "$(dirname "$0")/torch_train_baseline.py" --steps 6 --warmup 2
} >>"$LOG" 2>&1
python3 "$(dirname "$0")/compare.py" "$LOG"
