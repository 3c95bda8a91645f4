#!/usr/bin/env python3
"""slideformer's tokenizer against Hugging Face `tokenizers` (run where it is installed: the GPU
machine, with transformers). For each tokenizer: the test tokenizers of tests/data/tokenizer, and
one trained here by `tokenizers` itself with the Llama 3 and Qwen2 pre-tokenizers (so the file is
HF's own writing), encode the built-in tricky texts and random texts with both and compare ids.

  python3 tools/tokenizer_parity.py --bin build/slideformer [--n 2000] [--work DIR]
Exit 0 when every text gives the same ids.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_reference as ref  # noqa: E402


def hf_trained(pattern, path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=(pattern == "llama3")))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(ref.PATTERNS[pattern]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([ref.CORPUS] * 5, trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
    tok.save(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    from tokenizers import Tokenizer
    work = a.work or tempfile.mkdtemp(prefix="sf_tok_")
    os.makedirs(work, exist_ok=True)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tokenizer")
    files = [os.path.join(here, f"{p}.json") for p in ("llama3", "qwen2", "gpt2", "sp-legacy", "sp-first")]
    for p in ("llama3", "qwen2"):
        path = os.path.join(work, f"hf_{p}.json")
        hf_trained(p, path)
        files.append(path)
    # A SentencePiece-style BPE written by tokenizers itself (Metaspace, no byte fallback: unk).
    from tokenizers import SentencePieceBPETokenizer
    sp = SentencePieceBPETokenizer(unk_token="<unk>")
    sp.train_from_iterator([ref.CORPUS] * 5, vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"],
                           show_progress=False)
    # As Mistral's newer files: no normalizer, Metaspace prepending on the first segment, no split.
    from tokenizers import pre_tokenizers as pt
    sp._tokenizer.normalizer = None
    sp._tokenizer.pre_tokenizer = pt.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    path = os.path.join(work, "hf_sentencepiece.json")
    sp.save(path)
    files.append(path)
    rng = random.Random(7)
    texts = ref.TRICKY + [ref.random_text(rng) for _ in range(a.n)]
    inp = "\n".join(json.dumps({"text": t}) for t in texts) + "\n"
    failed = 0
    for f in files:
        hf = Tokenizer.from_file(f)
        want = [hf.encode(t).ids for t in texts]
        p = subprocess.run([a.bin, "tokenize", "--tokenizer", f, "--jsonl", "-"], input=inp, capture_output=True,
                           text=True)
        if p.returncode != 0:
            print(f"[FAIL] {f}: slideformer exit {p.returncode}: {p.stderr.strip()}")
            failed += 1
            continue
        got = [json.loads(line)["ids"] for line in p.stdout.splitlines() if line.startswith("{\"ids\"")]
        bad = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
        if len(got) != len(texts):
            bad.append(-1)
        status = "ok  " if not bad else "FAIL"
        print(f"[{status}] {os.path.basename(f)}: {len(texts)} texts, {len(bad)} differ")
        for i in bad[:3]:
            if i >= 0:
                print(f"    {texts[i]!r}\n      hf   {want[i]}\n      sf   {got[i]}")
        failed += bool(bad)
    print(f"{len(files) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
