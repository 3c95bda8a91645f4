#!/usr/bin/env python3
"""Compact optimizer state, quality: the same training with fp32 and with bf16 AdamW m and v.

    python3 tools/state_quality.py --bin gpubin/slideformer [--device cuda] [--work DIR]
        [--steps 500] [--eval-every 50] [--batch-size 8] [--seq-len 1024] [--tokenizer FILE]
        [--cli-args "--offload --gpu-blobs 2"]

Data: real text that Debian ships: the Python standard library's sources (/usr/lib/python3*/) and
the text files of /usr/share/doc (README*, *.txt, *.md, copyright, changelogs, .gz unpacked),
files in sorted order, about 3 % of them (chosen by a hash of the path) held out for evaluation.
Tokenized by `slideformer tokenize` with a real tokenizer.json: --tokenizer, else Llama 3's (or the first) of
tmp/tokenizers/*.json.gz (tools/tokenizer_parity.py fetch --gzip), else the byte-level BPE fixture
tests/data/tokenizer/llama3.json (small vocabulary: more tokens a byte, the same comparison).
The token stream is cut into rows of --seq-len tokens (every token trained).

Model: the Llama 3.2 1B shape (fuzz/corpus/config/llama-3.2-1b.json), random init (`slideformer
init`, seed fixed), trained --steps steps (AdamW lr 3e-4, warmup 50, cosine, wd 0.1, clip 1.0,
seed 1) twice: --optimizer-state fp32 and bf16, everything else equal. Eval loss on the held-out
rows every --eval-every steps (the trainer's --metrics records).

Check (issue 17): at every evaluation |loss_bf16 - loss_fp32| / loss_fp32 <= 1 %. Prints the two
curves as a table (for docs/PERFORMANCE.md) and one JSON line; exit 0 when the check passes, 1 when
it does not, 2 on a setup error.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOL = 0.01


def log(msg: str) -> None:
    print(msg, flush=True)


def text_files() -> list[str]:
    files = sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
    for f in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
        name = os.path.basename(f).lower()
        if not os.path.isfile(f) or os.path.islink(f):
            continue
        base = name[:-3] if name.endswith(".gz") else name
        if base.startswith(("readme", "copyright", "changelog", "news")) or base.endswith((".txt", ".md", ".rst")):
            files.append(f)
    return files


def read_text(path: str) -> str:
    try:
        raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    except OSError:
        return ""
    if b"\0" in raw:
        return ""
    return raw.decode("utf-8", errors="replace")


def held_out(path: str) -> bool:
    return hashlib.sha1(path.encode()).digest()[0] < 8  # ~3 %


def pick_tokenizer(arg: str | None, work: Path) -> Path:
    if arg:
        return Path(arg)
    # Llama 3's first: its 128,256 ids fit the Llama 3.2 1B config (DeepSeek-V3's 129,280 do not).
    found = sorted(glob.glob(str(ROOT / "tmp/tokenizers/*.json.gz")), key=lambda g: (not Path(g).name.startswith("llama3"), g))
    for gz in found:
        out = work / Path(gz).name[:-3]
        out.write_bytes(gzip.open(gz).read())
        return out
    return ROOT / "tests/data/tokenizer/llama3.json"


def tokenize(bin_: str, tok: Path, docs: list[str], out_ids: Path) -> list[int]:
    """The documents' ids, concatenated (one stream)."""
    src = out_ids.with_suffix(".text.jsonl")
    with open(src, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    with open(src) as fin, open(out_ids, "w") as fout:
        subprocess.run([bin_, "tokenize", "--tokenizer", str(tok), "--jsonl", "-", "--max-record-bytes", "256MiB"],
                       stdin=fin, stdout=fout, check=True)
    ids: list[int] = []
    with open(out_ids) as f:
        for line in f:
            j = json.loads(line)
            if "ids" in j:
                ids.extend(j["ids"])
    return ids


def write_rows(ids: list[int], T: int, n_rows: int, path: Path) -> int:
    rows = min(n_rows, len(ids) // T)
    with open(path, "w") as f:
        for r in range(rows):
            f.write(json.dumps({"input_ids": ids[r * T:(r + 1) * T]}) + "\n")
    return rows


def train(a, state: str, model: Path, train_data: Path, eval_data: Path, work: Path) -> dict[int, float]:
    out = work / f"out_{state}"
    metrics = work / f"metrics_{state}.jsonl"
    shutil.rmtree(out, ignore_errors=True)  # this script's own output of an earlier run
    if metrics.exists():
        metrics.unlink()
    cmd = [a.bin, "train", "--model", str(model), "--data", str(train_data), "--eval-data", str(eval_data),
           "--eval-every", str(a.eval_every), "--output", str(out), "--steps", str(a.steps), "--lr", "3e-4",
           "--warmup-steps", "50", "--lr-schedule", "cosine", "--weight-decay", "0.1", "--max-grad-norm", "1",
           "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len), "--seed", "1", "--device", a.device,
           "--optimizer-state", state, "--metrics", str(metrics), "--no-data-cache", "--log-every", "50"]
    cmd += shlex.split(a.cli_args)
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    t0 = time.time()
    subprocess.run(cmd, check=True)
    log(f"{state}: {time.time() - t0:.0f} s")
    evals: dict[int, float] = {}
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if j.get("type") == "eval":
                evals[int(j["step"])] = float(j["loss"])
    return evals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", default="/tmp/state_quality")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--eval-rows", type=int, default=64)
    ap.add_argument("--tokenizer")
    ap.add_argument("--config", default=str(ROOT / "fuzz/corpus/config/llama-3.2-1b.json"))
    ap.add_argument("--cli-args", default="", help="more train options for both runs (engine placement)")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)

    files = text_files()
    need = a.steps * a.batch_size

    def docs(held: bool, max_chars: int) -> list[str]:  # in file order, until enough text
        out, n = [], 0
        for f in files:
            if held_out(f) != held:
                continue
            t = read_text(f)
            if t.strip():
                out.append(t)
                n += len(t)
            if n >= max_chars:
                break
        return out

    # ~8 characters a token is more than any tokenizer needs (byte-level BPE on code: 2-4).
    train_docs = docs(False, need * a.seq_len * 8)
    eval_docs = docs(True, a.eval_rows * a.seq_len * 8)
    log(f"text: {len(files)} files, {sum(map(len, train_docs)) / 1e6:.1f} MB train, "
        f"{sum(map(len, eval_docs)) / 1e6:.1f} MB held out")
    if not train_docs or not eval_docs:
        log("no text found under /usr/lib/python3* and /usr/share/doc")
        return 2
    tok = pick_tokenizer(a.tokenizer, work)
    log(f"tokenizer: {tok}")
    train_ids = tokenize(a.bin, tok, train_docs, work / "train_ids.jsonl")
    eval_ids = tokenize(a.bin, tok, eval_docs, work / "eval_ids.jsonl")
    n_train = write_rows(train_ids, a.seq_len, need, work / "train.jsonl")
    n_eval = write_rows(eval_ids, a.seq_len, a.eval_rows, work / "eval.jsonl")
    log(f"rows of {a.seq_len} tokens: {n_train} train ({need} needed for one pass; fewer wrap around), "
        f"{n_eval} eval; {len(train_ids) / max(1, sum(map(len, train_docs))):.2f} tokens a character")
    if n_train == 0 or n_eval == 0:
        log("too little text for one row")
        return 2

    model = work / "model"
    if not (model / "config.json").exists():
        subprocess.run([a.bin, "init", "--config", a.config, "--output", str(model), "--dtype", "bf16"], check=True)
    curves = {s: train(a, s, model, work / "train.jsonl", work / "eval.jsonl", work) for s in ("fp32", "bf16")}
    steps = sorted(set(curves["fp32"]) & set(curves["bf16"]))
    worst = 0.0
    log("| step | eval loss, fp32 state | eval loss, bf16 state | relative difference |")
    log("| ---: | ---: | ---: | ---: |")
    for s in steps:
        f, b = curves["fp32"][s], curves["bf16"][s]
        rel = abs(b - f) / f
        worst = max(worst, rel)
        log(f"| {s} | {f:.4f} | {b:.4f} | {100 * rel:.2f} % |")
    ok = len(steps) >= a.steps // a.eval_every and worst <= TOL
    print(json.dumps({"check": "state_quality", "ok": ok, "evaluations": len(steps), "worst_relative": worst,
                      "fp32": curves["fp32"], "bf16": curves["bf16"]}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
