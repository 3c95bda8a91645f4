#!/usr/bin/env python3
"""Data throughput of slideformer next to Hugging Face tokenizers' encode_batch, on the same machine
and the same data (issue 16): for text, prompt/completion and chat records,

  hf        tokenizers' encode_batch (all cores, its own pool) on the texts already in memory
            (prompts with the BOS, completions and rendered chats without): the encoder alone
  tokenize  `slideformer tokenize --model M --jsonl FILE` to a file: reading, parsing, rendering,
            encoding (and offsets for chat masks) and writing, end to end
  train     `slideformer train`'s data loading (its log line "data: ... in S s": reading, parsing,
            rendering, encoding, labels; shown with -v), on a tiny model with the tokenizer's vocabulary

MB/s is always the bytes of the texts the tokenizer encodes (text; prompt + completion; the rendered
chat), divided by the wall time of that stage: the same numerator for every column. tokenize_cpu_s
is the CPU time (all threads) of the fastest tokenize run: on a shared machine, the figure that
is the program's own.

  data_throughput.py [--bin build/slideformer] [--tokenizer tmp/tokenizers/llama3.json[.gz]]
                     [--template tests/data/chat_templates/llama3.1.jinja] [--mb 20] [--work tmp/data_tp]
                     [--kinds text,prompt,chat] [--repeat 2]

The data is generated into --work (Python's own sources and generated multilingual text, as
tools/tokenizer_parity.py bench; chats of 2-6 turns cut from the same texts) when absent. Prints one
line per kind and a JSON line per kind ({"kind", "MB", "hf_MB/s", "tokenize_MB/s", "train_MB/s",
"tokenize/hf", "train/hf", "same_ids"}). Exit status 0 when every stage ran (and where tokenizers is
installed, slideformer's ids equal encode_batch's for text and prompt/completion records).
"""
import argparse
import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def unzipped(path, work):
    if not path.endswith(".gz"):
        return path
    out = os.path.join(work, os.path.basename(path)[:-3])
    if not os.path.exists(out):
        with gzip.open(path, "rb") as src, open(out + ".part", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(out + ".part", out)
    return out


def make_data(work, mb, seed):
    """text.jsonl, prompt.jsonl, chat.jsonl in work (each about mb MB of text)."""
    import tokenizer_parity as tp
    base = os.path.join(work, "base.jsonl")
    if not os.path.exists(base):
        tp.bench_corpus(base, mb, seed)
    texts = [json.loads(line)["text"] for line in open(base, encoding="utf-8")]
    rng = random.Random(seed)
    files = {k: os.path.join(work, k + ".jsonl") for k in ("text", "prompt", "chat")}
    if not os.path.exists(files["text"]):
        shutil.copyfile(base, files["text"])
    if not os.path.exists(files["prompt"]):
        with open(files["prompt"], "w", encoding="utf-8") as f:
            for t in texts:
                cut = rng.randrange(len(t) // 4, max(len(t) // 4 + 1, 3 * len(t) // 4))
                f.write(json.dumps({"prompt": t[:cut], "completion": t[cut:]}, ensure_ascii=False) + "\n")
    if not os.path.exists(files["chat"]):
        with open(files["chat"], "w", encoding="utf-8") as f:
            for t in texts:
                turns = rng.randrange(2, 7)
                step = max(1, len(t) // turns)
                msgs = []
                if rng.random() < 0.3:
                    msgs.append({"role": "system", "content": "You are a helpful assistant."})
                for k in range(turns):
                    msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": t[k * step:(k + 1) * step]})
                if msgs[-1]["role"] != "assistant":
                    msgs.append({"role": "assistant", "content": "OK."})
                f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    return files


def model_dir(work, tokenizer, template, binary):
    """A tiny Llama with the tokenizer's vocabulary, its tokenizer.json and chat template."""
    d = os.path.join(work, "model")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return d
    tj = json.load(open(tokenizer, encoding="utf-8"))
    vocab = max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj.get("added_tokens") or []]) + 1
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": 16,
           "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "max_position_embeddings": 1 << 20, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "torch_dtype": "float32"}
    cfg_path = os.path.join(work, "tiny_config.json")
    json.dump(cfg, open(cfg_path, "w"))
    subprocess.run([binary, "init", "--config", cfg_path, "--output", d, "-q"], check=True)
    shutil.copyfile(tokenizer, os.path.join(d, "tokenizer.json"))
    specials = [a["content"] for a in tj.get("added_tokens") or []]
    bos = next((s for s in specials if s in ("<|begin_of_text|>", "<s>", "<bos>")), None)
    eos = next((s for s in specials if s in ("<|eot_id|>", "<|im_end|>", "</s>", "<eos>")), None)
    conf = {"chat_template": open(template, encoding="utf-8").read()}
    if bos:
        conf["bos_token"] = bos
    if eos:
        conf["eos_token"] = eos
    json.dump(conf, open(os.path.join(d, "tokenizer_config.json"), "w"), ensure_ascii=False)
    return d


def timed(cmd, **kw):
    """(wall seconds, the process); the CPU seconds it used are added to CPU[0]."""
    import resource
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    kw.setdefault("stdout", subprocess.PIPE)
    p = subprocess.run(cmd, stderr=subprocess.PIPE, text=True, **kw)
    s = time.time() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU[0] = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return s, p


CPU = [0.0]  # CPU seconds of the last timed() command (all its threads)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/slideformer")
    ap.add_argument("--tokenizer", default="tmp/tokenizers/llama3.json")
    ap.add_argument("--template", default=os.path.join(HERE, "..", "tests", "data", "chat_templates", "llama3.1.jinja"))
    ap.add_argument("--mb", type=float, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="tmp/data_tp")
    ap.add_argument("--kinds", default="text,prompt,chat")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each stage; the fastest counts")
    ap.add_argument("--no-train", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(a.tokenizer) and os.path.exists(a.tokenizer + ".gz"):
        a.tokenizer += ".gz"
    if not os.path.exists(a.tokenizer):
        print(f"data_throughput.py: {a.tokenizer} not found (python3 tools/tokenizer_parity.py fetch tmp/tokenizers)",
              file=sys.stderr)
        return 2
    os.makedirs(a.work, exist_ok=True)
    tok_path = unzipped(a.tokenizer, a.work)
    files = make_data(a.work, a.mb, a.seed)
    mdir = model_dir(a.work, tok_path, a.template, a.bin)
    cpus = len(os.sched_getaffinity(0))
    try:
        import tokenizers
        hf = tokenizers.Tokenizer.from_file(tok_path)
        hf_version = tokenizers.__version__
    except ImportError:
        hf, hf_version = None, None
    print(f"cpus {cpus}, tokenizers {hf_version or 'not installed'}, tokenizer {os.path.basename(tok_path)}, "
          f"binary {a.bin}", flush=True)
    failed = 0
    for kind in a.kinds.split(","):
        src = files[kind]
        out = os.path.join(a.work, kind + ".tokens.jsonl")
        row = {"kind": kind, "cpus": cpus}
        best = None
        for _ in range(a.repeat):
            with open(out, "w") as f:
                s, p = timed([a.bin, "tokenize", "--model", mdir, "--jsonl", src], stdout=f)
            if p.returncode != 0:
                row["tokenize_error"] = p.stderr[-400:]
                failed += 1
                break
            if best is None or s < best:
                best, row["tokenize_cpu_s"] = s, round(CPU[0], 2)
        outs = [json.loads(line) for line in open(out, encoding="utf-8")] if best else []
        recs = [json.loads(line) for line in open(src, encoding="utf-8")]
        # The texts the tokenizer encodes, as (text, add_special) batches.
        if kind == "text":
            batches = [([r["text"] for r in recs], True)]
        elif kind == "prompt":
            batches = [([r["prompt"] for r in recs], True), ([r["completion"] for r in recs], False)]
        else:
            batches = [([o["text"] for o in outs], False)]
        mb = sum(len(t.encode()) for b, _ in batches for t in b) / 1e6
        row["MB"] = round(mb, 2)
        if best:
            row["tokenize_MB/s"] = round(mb / best, 2)
        if hf is not None and (kind != "chat" or outs):
            hbest, enc = None, None
            for _ in range(a.repeat):
                t0 = time.time()
                enc = [hf.encode_batch(b, add_special_tokens=sp) for b, sp in batches]
                s = time.time() - t0
                hbest = s if hbest is None else min(hbest, s)
            row["hf_MB/s"] = round(mb / hbest, 2)
            if outs:
                if kind == "prompt":
                    want = [x.ids + y.ids for x, y in zip(enc[0], enc[1])]
                else:
                    want = [x.ids for x in enc[0]]
                row["same_ids"] = want == [o["ids"] for o in outs]
                failed += not row["same_ids"]
            del enc
        if not a.no_train:
            tbest = None
            for _ in range(a.repeat):
                tout = os.path.join(a.work, "train_out")
                cmd = [a.bin, "train", "--model", mdir, "--data", src, "--output", tout, "--steps", "1",
                       "--batch-size", "1", "--seq-len", "64", "--lr", "1e-5", "--no-data-cache", "--device", "cpu", "-v"]
                s, p = timed(cmd)
                m = re.search(r"data: .* in ([0-9.]+) s", p.stderr)
                if p.returncode != 0 or not m:
                    row["train_error"] = (p.stderr or p.stdout)[-400:]
                    failed += 1
                    break
                t = float(m.group(1))
                tbest = t if tbest is None else min(tbest, t)
            if tbest:
                row["train_MB/s"] = round(mb / tbest, 2)
        for k in ("tokenize", "train"):
            if row.get(k + "_MB/s") and row.get("hf_MB/s"):
                row[k + "/hf"] = round(row[k + "_MB/s"] / row["hf_MB/s"], 2)
        print(f"{kind:7s} {mb:6.1f} MB  hf encode_batch {row.get('hf_MB/s', '-')} MB/s  "
              f"slideformer tokenize {row.get('tokenize_MB/s', '-')} MB/s ({row.get('tokenize_cpu_s', '-')} CPU s)  train loading {row.get('train_MB/s', '-')} MB/s",
              flush=True)
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
