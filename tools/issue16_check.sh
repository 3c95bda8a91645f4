#!/usr/bin/env bash
# Issue 16's reproducers against a built binary, each as the outside report ran it, with what the
# program must do now (exit code, one line on stderr, the user's files untouched). One line per
# case: "ok" or "FAIL" and why; exit status 0 when every case passes. The regression tests in
# tests/ (test_cli.cpp, test_checkpoint_dir.cpp, test_limits.cpp, ...) hold the same cases; this is
# the quick look at a binary (any build, also a sanitizer one).
#
# Usage: bash tools/issue16_check.sh [BIN]   (default build/slideformer)
set -u
BIN=$(realpath "${1:-build/slideformer}")
W=$(mktemp -d /tmp/sf_issue16.XXXXXX)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 2
fails=0
ok() { echo "ok    $1"; }
fail() {
  echo "FAIL  $1: $2"
  fails=$((fails + 1))
}
# expect CODE NAME CMD...: the exit code, and for code 2 exactly one line on stderr.
expect() {
  local want=$1 name=$2
  shift 2
  timeout 60 "$@" >out.txt 2>err.txt
  local got=$?
  local lines
  lines=$(wc -l <err.txt)
  if [ "$got" != "$want" ]; then
    fail "$name" "exit $got, want $want: $(head -c 300 err.txt)"
    return 1
  fi
  if [ "$want" = 2 ] && [ "$lines" != 1 ]; then
    fail "$name" "$lines lines on stderr: $(head -c 300 err.txt)"
    return 1
  fi
  ok "$name"
}
sum() { find "$@" -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum; }

cat >cfg.json <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 37, "hidden_size": 8,
 "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
EOF
"$BIN" init --config cfg.json --output model -q >/dev/null || {
  echo "init failed"
  exit 2
}
for i in $(seq 1 8); do echo "{\"input_ids\": [1, 2, 3, $i, 5, 6, 7, 8]}"; done >data.jsonl
T=(--data data.jsonl --seq-len 16 --lr 1e-3 --device cpu -q)

# --- data loss
mkdir -p pretrained
cp model/model.safetensors model/config.json pretrained/
for f in generation_config.json special_tokens_map.json tokenizer_config.json tokenizer.json; do echo '{}' >pretrained/$f; done
before=$(sum pretrained)
expect 2 "save_pretrained-style directory as --output is refused" "$BIN" train --model model "${T[@]}" --steps 1 --output pretrained
[ "$(sum pretrained)" = "$before" ] || fail "save_pretrained-style directory" "its files changed"
expect 2 "--output equal to --model is refused" "$BIN" train --model model "${T[@]}" --steps 1 --output model
before=$(sha256sum data.jsonl)
expect 2 "--metrics on the data file is refused" "$BIN" train --model model "${T[@]}" --steps 1 --output o1 --metrics data.jsonl
expect 2 "grad --output on its data file is refused" "$BIN" grad --model model --data data.jsonl --seq-len 16 --device cpu --output data.jsonl
[ "$(sha256sum data.jsonl)" = "$before" ] || fail "data file" "changed"
echo "mine" >notes.txt
expect 2 "grad --output on a user's file is refused" "$BIN" grad --model model --data data.jsonl --seq-len 16 --device cpu --output notes.txt
[ "$(cat notes.txt)" = mine ] || fail "user's file" "changed by grad"
expect 0 "a first train" "$BIN" train --model model "${T[@]}" --steps 2 --output out --save-every 1
echo mine >out/notes.tmp-1-abc
printf '{"input_ids": [1, 2, 3], "labels": [-100, -100, -100]}\n' >masked.jsonl
expect 2 "all labels -100 is refused" "$BIN" train --model model --data masked.jsonl --seq-len 16 --lr 1e-3 --device cpu --steps 1 --output out
[ "$(cat out/notes.tmp-1-abc 2>/dev/null)" = mine ] || fail "notes.tmp-1-abc" "removed by a failing run"
expect 0 "a second train on the output" "$BIN" train --model model "${T[@]}" --steps 2 --output out
[ "$(cat out/notes.tmp-1-abc 2>/dev/null)" = mine ] || fail "notes.tmp-1-abc" "removed"
mkdir -m 700 private
expect 0 "an empty mode-700 output" "$BIN" train --model model "${T[@]}" --steps 1 --output private
[ "$(stat -c %a private)" = 700 ] || fail "mode 700" "came back $(stat -c %a private)"

# A kill at every crash point (each rename, fsync and link of a save, each step of a removal) of a
# run that replaces an output holding a checkpoint; after each, the next run leaves nothing behind
# and the output is complete.
K=(--model model "${T[@]}" --steps 2 --save-every 1 --output kill)
"$BIN" train "${K[@]}" >/dev/null 2>&1
points=$(SF_CRASH_TRACE=1 "$BIN" train "${K[@]}" 2>&1 | grep -c "^crash point")
bad=""
for n in $(seq 1 "$points"); do
  SF_CRASH_AT=$n "$BIN" train "${K[@]}" >/dev/null 2>&1 &
  wait $! 2>/dev/null
  "$BIN" train "${K[@]}" >/dev/null 2>err.txt || bad="$bad $n:rerun-failed"
  left=$(ls -a | grep -E '^kill\.(sf-|tmp-)' || true)
  [ -n "$left" ] && bad="$bad $n:$left"
  [ -f kill/model.safetensors ] && [ -f kill/checkpoint-1/model.safetensors ] || bad="$bad $n:incomplete"
done
[ "$points" -gt 5 ] && [ -z "$bad" ] && ok "a kill at each of $points crash points: the next run cleans up" ||
  fail "kills at crash points ($points)" "$bad"

# Two and three concurrent runs on one output: one runs, the others exit 2 naming the holder.
pids=()
for k in 1 2 3; do
  "$BIN" train --model model "${T[@]}" --steps 100000 --output conc >/dev/null 2>conc$k.err &
  pids+=($!)
done
sleep 3
alive=0
for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=$((alive + 1)); done
refused=$(grep -l "in use by another slideformer run (pid" conc*.err | wc -l)
[ "$alive" = 1 ] && [ "$refused" = 2 ] && ok "three runs on one output: one runs, two refused" ||
  fail "three runs on one output" "$alive running, $refused refused"
for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null; done
wait 2>/dev/null

# What else a run writes is locked too: its --metrics file; a run resuming from its checkpoint into
# another output runs beside it, into its own output is refused.
"$BIN" train --model model "${T[@]}" --steps 100000 --save-every 1 --output lk --metrics lk.jsonl >/dev/null 2>lk.err &
pid=$!
for i in $(seq 1 100); do [ -f lk/checkpoint-1/.sf-manifest.json ] && break; sleep 0.2; done
expect 2 "a second run on a running run's --metrics file" "$BIN" train --model model "${T[@]}" --steps 1 --output lk2 --metrics lk.jsonl
expect 0 "--resume OUT/checkpoint-1 --output OUT2 beside the run on OUT" "$BIN" train --model model "${T[@]}" --steps 2 --output lk3 --resume lk/checkpoint-1
expect 2 "--resume OUT/checkpoint-1 --output OUT while OUT is in use" "$BIN" train --model model "${T[@]}" --steps 2 --output lk --resume lk/checkpoint-1
kill -INT $pid
wait $pid 2>/dev/null

# --- silent corruption
python3 - <<'EOF'
import struct
p = "out/model.safetensors"
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
b[8 + n + 5] ^= 0x10
open("flipped.safetensors", "wb").write(b)
EOF
cp -r out flipped && cp flipped.safetensors flipped/model.safetensors
expect 2 "one flipped bit in a final model: eval refuses it" "$BIN" eval --model flipped --data data.jsonl --seq-len 16 --device cpu
expect 2 "one flipped bit: train --model refuses it" "$BIN" train --model flipped "${T[@]}" --steps 1 --output o2
sed -i 's/"step": 1/"step": 2/' out/checkpoint-1/trainer_state.json
expect 2 "an edited trainer_state.json is refused on --resume" "$BIN" train --model model "${T[@]}" --steps 3 --output o3 --resume out/checkpoint-1
printf '{"input_ids": [1, 2, 3]}\x00{"input_ids": [4]}\n' >nul.jsonl
expect 2 "a NUL byte in a JSONL line" "$BIN" train --model model --data nul.jsonl --seq-len 16 --lr 1e-3 --device cpu --steps 1 --output o4

# --- options
expect 2 "--slots 4194305" "$BIN" train --model model "${T[@]}" --steps 1 --output o5 --offload --slots 4194305
expect 2 "--metrics /dev/full" "$BIN" train --model model "${T[@]}" --steps 1 --output o6 --metrics /dev/full
expect 2 "a non-UTF-8 --output path" "$BIN" train --model model "${T[@]}" --steps 1 --output "$(printf 'o\xff')"
[ -e "$(printf 'o\xff')" ] && fail "non-UTF-8 path" "it was created"

# --- untrusted programs: a template of 10,000 terms, a tokenizer normalizer growing 2^40 times
mkdir -p tmpl
python3 - <<'EOF'
import json
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": None, "decoder": None,
       "model": {"type": "BPE", "vocab": {chr(c): i for i, c in enumerate(range(33, 127))}, "merges": []}}
json.dump(tok, open("tmpl/tokenizer.json", "w"))
json.dump({"chat_template": "{{ " + "+".join(["1"] * 10000) + " }}"}, open("tmpl/tokenizer_config.json", "w"))
tok["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}] * 40}
json.dump(tok, open("grow.json", "w"))
open("chat.jsonl", "w").write(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n")
EOF
expect 2 "a 10,000-term template expression" "$BIN" tokenize --model tmpl --jsonl chat.jsonl
bomb() {  # a chat template (the Python expression $2) through tokenize: exit 2 (one line) within 60 s
  python3 -c "import json, sys; json.dump({'chat_template': eval(sys.argv[1])}, open('tmpl/tokenizer_config.json', 'w'))" "$2"
  expect 2 "$1" "$BIN" tokenize --model tmpl --jsonl chat.jsonl
}
bomb "a self-referential namespace printed with tojson" "'{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns | tojson }}'"
bomb "[('a'*16000000)]*300" "\"{{ [('a'*16000000)]*300 }}\""
bomb "for c in 'a'*16000000" "\"{% for c in 'a'*16000000 %}{{ c }}{% endfor %}\""
bomb "range(16000000)|list|unique" "'{{ range(16000000)|list|unique|list|length }}'"
bomb "a 100,000-long filter chain inside if false" "'{% if false %}{{ x' + '|trim' * 100000 + ' }}{% endif %}'"
python3 -c "import json; json.dump({'chat_template': '{{ 1e999 }}|{{ 1e-400 }}'}, open('tmpl/tokenizer_config.json', 'w'))"
expect 0 "{{ 1e999 }}, {{ 1e-400 }} render as Python's (no stod error)" "$BIN" tokenize --model tmpl --jsonl chat.jsonl
grep -q '"text":"inf|0.0"' out.txt || fail "{{ 1e999 }}" "rendered $(head -c 200 out.txt)"
# NaN in an input model's weights (--no-verify skips this check on purpose).
python3 - <<'EOF'
import json, shutil, struct
b = bytearray(open("model/model.safetensors", "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h.pop("__metadata__", None)
o = 8 + n + h[sorted(h)[0]]["data_offsets"][0]
b[o:o + 4] = struct.pack("<f", float("nan"))
shutil.copytree("model", "nanmodel")
open("nanmodel/model.safetensors", "wb").write(b)
EOF
expect 2 "NaN in an input model's weights (eval)" "$BIN" eval --model nanmodel --data data.jsonl --seq-len 16 --device cpu
expect 2 "a normalizer of 40 x Replace a->aa" "$BIN" tokenize --tokenizer grow.json --text aaaa

echo "$fails failed"
[ "$fails" = 0 ]
