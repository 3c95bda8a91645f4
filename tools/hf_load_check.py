#!/usr/bin/env python3
"""Does a slideformer output directory load with transformers as a user would load it?

Makes a tiny Llama model (slideformer init) with a real-format tokenizer (tests/data/tokenizer/
llama3.json), a tokenizer_config.json and a generation_config.json with non-default values,
trains it 3 steps on text records with slideformer, then loads the output with
AutoModelForCausalLM and AutoTokenizer: the tokenizer gives slideformer's ids, the model's loss on
the data equals `slideformer eval`'s, generate() runs, and generation_config.json is the input's.
Prints one line per check and `N passed, M failed`.

Usage: hf_load_check.py --bin build/slideformer [--device cuda|cpu] [--work DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sh(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(args)}\n{p.stderr[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--work", default="/tmp/hf_load_check")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    w = lambda *p: os.path.join(a.work, *p)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 408, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "tie_word_embeddings": True, "bos_token_id": 406, "eos_token_id": 407, "torch_dtype": "bfloat16"}
    json.dump(cfg, open(w("config.json"), "w"))
    sh([a.bin, "init", "--config", w("config.json"), "--output", w("m"), "--seed", "1", "--dtype", "bf16"])
    shutil.copy(os.path.join(ROOT, "tests/data/tokenizer/llama3.json"), w("m", "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
               "eos_token": "<|end_of_text|>", "model_max_length": 256}, open(w("m", "tokenizer_config.json"), "w"))
    gen = {"bos_token_id": 406, "eos_token_id": 407, "do_sample": True, "temperature": 0.6, "top_p": 0.9,
           "transformers_version": "4.45.0"}
    json.dump(gen, open(w("m", "generation_config.json"), "w"), indent=2)
    texts = ["hello world, this is a test of the tokenizer", "the quick brown fox jumps over the lazy dog",
             "slideformer trains models that do not fit", "12345 + 678 = 13023"] * 4
    with open(w("d.jsonl"), "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    sh([a.bin, "train", "--model", w("m"), "--data", w("d.jsonl"), "--output", w("o"), "--steps", "3", "--lr", "1e-2",
        "--batch-size", "4", "--device", a.device, "--no-data-cache"])
    ev = json.loads(sh([a.bin, "eval", "--model", w("o"), "--data", w("d.jsonl"), "--device", "cpu",
                        "--no-data-cache"]).strip().splitlines()[-1])
    sf_ids = [json.loads(l)["ids"] for l in sh([a.bin, "tokenize", "--model", w("o"), "--jsonl", w("d.jsonl")]).splitlines()]

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    ok, bad = 0, 0

    def check(name, cond, detail=""):
        nonlocal ok, bad
        ok, bad = ok + bool(cond), bad + (not cond)
        print(f"[{'ok  ' if cond else 'FAIL'}] {name} {detail}")

    tok = AutoTokenizer.from_pretrained(w("o"))
    hf_ids = [tok(t)["input_ids"] for t in texts]
    check("AutoTokenizer ids == slideformer tokenize ids", hf_ids == sf_ids)
    model = AutoModelForCausalLM.from_pretrained(w("o"), torch_dtype=torch.float32)
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for ids in sf_ids:
            x = torch.tensor([ids])
            out = model(input_ids=x, labels=x)
            k = len(ids) - 1
            tot += float(out.loss) * k
            n += k
    hf_loss = tot / n
    rel = abs(hf_loss - ev["loss"]) / ev["loss"]
    check("AutoModelForCausalLM loss == slideformer eval loss", rel < 1e-3 and n == ev["tokens"],
          f"(hf {hf_loss:.6f}, slideformer {ev['loss']:.6f}, rel {rel:.2e}; bf16 weights, fp32 compute both)")
    gc = GenerationConfig.from_pretrained(w("o"))
    check("generation_config.json kept", json.load(open(w("o", "generation_config.json"))) == gen and
          gc.temperature == 0.6 and gc.top_p == 0.9)
    with torch.no_grad():
        g = model.generate(**tok("hello world", return_tensors="pt"), max_new_tokens=8, do_sample=False)
    check("generate() runs", g.shape[1] > 0, f"-> {tok.decode(g[0])!r}")
    print(f"{ok} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
