#!/usr/bin/env python3
"""An independent reference for slideformer's byte-level BPE tokenizer (src/data/tokenizer/tokenizer.cpp):
the pre-tokenizer with the real regular expression (the `regex` module), GPT-2's byte map and BPE
merges by rank, written here in Python from the same public description.

  tokenizer_reference.py make-tokenizer OUT.json [--pattern llama3|qwen2|gpt2] [--merges N]
      a small tokenizer.json: 256 byte tokens, N merges learned from a built-in corpus, a BOS
  tokenizer_reference.py cases TOKENIZER.json OUT.json
      pieces and ids of a built-in set of tricky texts (the C++ test's expected values)
  tokenizer_reference.py diff TOKENIZER.json SLIDEFORMER [--n 2000] [--seed 1]
      random texts through both; prints the first differences

On the GPU machine, tools/tokenizer_parity.py compares with Hugging Face `tokenizers` itself.
"""
import argparse
import json
import random
import subprocess
import sys

import regex

PATTERNS = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    # Mistral Nemo (tekken)
    "tekken": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
              r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
              r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

TRICKY = [
    "Hello world", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\r\n\r\nhere",
    "I'm you're we've they'll it'd HE'S SHE'LL", "numbers 1 12 123 1234 12345 3.14159",
    "emoji 😀👍🏽 and CJK 漢字かなカナ 한국어", "accents café naïve Zürich", "symbols !@#$%^&*()_+-=[]{}|;:,.<>?/~`",
    "mixed_snake_case and camelCase and kebab-case", "  \n  \n", " ", "", "a", "\n", "  x  ",
    "don't stop", "x'sy", "'", "''", "''s", "Ünïcödé ÅÄÖ", "٣٤٥ arabic digits ١٢٣", "Ⅻ roman ⅻ", "½ ¾ fractions",
    "line1\nline2\n\nline4", "spaces    before\nnewline", "tab\t\tx", "nbsp\u00a0here", "zero\u200bwidth",
    "<|begin_of_text|>special<|end_of_text|> inside", "http://example.com/path?q=1&r=2",
    "def f(x):\n    return x ** 2\n", "{\"json\": [1, 2, 3]}",
    "HTTPServer getHTTPResponse XMLHttpRequest iPhone McDonald's ǅungla ǈ", "a/b//c\n/d", "e\u0301\u0301X\u0301",
    " \u0301abc", "\u02b0\u02b0A\u02b0", "漢字Abc", "ABC\u0300def", "x2y 3z", "ﬁ ﬀ", "Ǆ ǅ ǆ",
]

CORPUS = " ".join(TRICKY * 3) + " the quick brown fox jumps over the lazy dog " * 20 + \
    "tokenizers split text into pieces and merge bytes by rank " * 10


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def mapped(piece):
    return "".join(B2U[b] for b in piece.encode("utf-8"))


def learn(words, n_merges):
    """Merges by pair frequency over {symbol tuple: count} (ties: the smallest pair)."""
    merges = []
    for _ in range(n_merges):
        counts = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        best = max(sorted(counts), key=lambda k: counts[k])
        merges.append(best)
        new = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
    return merges


def learn_merges(pattern, n_merges):
    words = {}
    for p in regex.findall(PATTERNS[pattern], CORPUS):
        w = tuple(mapped(p))
        words[w] = words.get(w, 0) + 1
    return learn(words, n_merges)


SP = "\u2581"


def sp_normalize(seg, prepend):
    return (SP if prepend else "") + seg.replace(" ", SP)


def make_sp_tokenizer(scheme, n_merges, split=False):
    # SentencePiece-style (Llama 2 / Mistral): chars of the corpus (rare ones left to byte
    # fallback), merges learned within "\u2581"-prefixed words.
    words = {}
    for w in sp_normalize(CORPUS, True).split(SP):
        if w:
            words[tuple(SP + w)] = words.get(tuple(SP + w), 0) + 1
    chars = sorted({c for w in words for c in w if ord(c) < 0x3000})
    merges = learn(words, n_merges)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    kept = []
    for a, b in merges:  # a merge needs both parts in the vocabulary (tokenizers refuses it else)
        if a in vocab and b in vocab:
            vocab.setdefault(a + b, len(vocab))
            kept.append((a, b))
    merges = kept
    tok = {
        "version": "1.0",
        "added_tokens": [
            {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))],
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    if scheme == "legacy":
        tok["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SP}, {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
        tok["pre_tokenizer"] = None
    else:
        tok["normalizer"] = None
        tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP, "prepend_scheme": scheme, "split": False}
        if split:  # the older form: no "split" key (tokenizers then splits)
            del tok["pre_tokenizer"]["split"]
    return tok


def make_tokenizer(pattern, n_merges):
    if pattern == "sp-split":
        return make_sp_tokenizer("always", n_merges, split=True)
    if pattern.startswith("sp-"):
        return make_sp_tokenizer(pattern[3:], n_merges)
    merges = learn_merges(pattern, n_merges)
    vocab = {B2U[b]: i for i, b in enumerate(range(256))}
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    bos, eos = len(vocab), len(vocab) + 1
    if pattern == "gpt2":
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERNS[pattern]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    return {
        "version": "1.0",
        "added_tokens": [
            {"id": bos, "content": "<|begin_of_text|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True},
            {"id": eos, "content": "<|end_of_text|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": pre,
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": pattern == "llama3",
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


class Reference:
    def __init__(self, tok):
        self.vocab = tok["model"]["vocab"]
        self.sp_split = False
        self.sp = None  # SentencePiece-style: "legacy" (prepend on every segment), "first" or "always"
        if tok.get("normalizer") and tok["normalizer"].get("type") == "Sequence":
            self.sp = "legacy"
        elif tok.get("pre_tokenizer") and tok["pre_tokenizer"].get("type") == "Metaspace":
            self.sp = tok["pre_tokenizer"].get("prepend_scheme", "always")
            self.sp_split = tok["pre_tokenizer"].get("split", True)  # tokenizers' default
        self.ignore_merges = tok["model"].get("ignore_merges", False)
        self.ranks = {}
        for i, m in enumerate(tok["model"]["merges"]):
            a, b = m.split(" ") if isinstance(m, str) else m
            self.ranks[(a, b)] = i
        pt = tok["pre_tokenizer"]
        if self.sp is None:
            self.pattern = PATTERNS["gpt2"] if pt["type"] == "ByteLevel" else pt["pretokenizers"][0]["pattern"]["Regex"]
        self.added = sorted(((a["content"], a["id"]) for a in tok["added_tokens"]), key=lambda x: -len(x[0]))
        self.prefix = []
        pp = tok["post_processor"]
        for p in (pp["processors"] if pp["type"] == "Sequence" else [pp]):
            if p["type"] == "TemplateProcessing":
                for item in p["single"]:
                    if "SpecialToken" in item:
                        self.prefix += p["special_tokens"][item["SpecialToken"]["id"]]["ids"]

    def pre(self, text):
        return regex.findall(self.pattern, text)

    def bpe(self, piece):
        word = mapped(piece)
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        return [self.vocab[s] for s in self.merge(list(word))]

    def merge(self, sym):
        while len(sym) > 1:
            best, at = None, 0
            for k in range(len(sym) - 1):
                r = self.ranks.get((sym[k], sym[k + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, k
            if best is None:
                break
            sym[at:at + 2] = [sym[at] + sym[at + 1]]
        return sym

    def segment(self, seg, start):
        if not seg:
            return []
        if self.sp is None:
            return [i for p in self.pre(seg) for i in self.bpe(p)]
        if self.sp == "legacy":  # Prepend normalizer: always
            norms = [sp_normalize(seg, True)]
        else:  # Metaspace: prepends only where the text does not start with a space already
            norm = seg.replace(" ", SP)
            if not norm.startswith(SP) and (self.sp == "always" or (self.sp == "first" and start == 0)):
                norm = SP + norm
            norms = [norm]
            if self.sp_split:  # split before each U+2581 (MergedWithNext)
                norms = [p for p in regex.split("(?=" + SP + ")", norm) if p]
        out = []
        for norm in norms:
            for s in self.merge(list(norm)):
                if s in self.vocab:
                    out.append(self.vocab[s])
                else:
                    out += [self.vocab[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
        return out

    def encode(self, text):
        out = list(self.prefix)
        seg, i = 0, 0
        while i < len(text):
            for content, tid in self.added:
                if text.startswith(content, i):
                    out += self.segment(text[seg:i], seg)
                    out.append(tid)
                    i += len(content)
                    seg = i
                    break
            else:
                i += 1
        out += self.segment(text[seg:], seg)
        return out


def random_text(rng):
    alphabet = ["a", "b", "Z", " ", " ", "\n", "\r", "\t", "'", "s", "ll", "1", "22", "333", "!", ".", "_", "é", "ß",
                "漢", "😀", "\u00a0", "٣", "Ⅻ", "<|begin_of_text|>", "<s>", "re", "ve", "D", "M"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-tokenizer")
    m.add_argument("out")
    m.add_argument("--pattern", default="llama3", choices=sorted(PATTERNS) + ["sp-legacy", "sp-first", "sp-always", "sp-split"])
    m.add_argument("--merges", type=int, default=200)
    c = sub.add_parser("cases")
    c.add_argument("tokenizer")
    c.add_argument("out")
    d = sub.add_parser("diff")
    d.add_argument("tokenizer")
    d.add_argument("slideformer")
    d.add_argument("--n", type=int, default=2000)
    d.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.cmd == "make-tokenizer":
        with open(a.out, "w") as f:
            json.dump(make_tokenizer(a.pattern, a.merges), f, ensure_ascii=False, indent=1)
        return 0
    ref = Reference(json.load(open(a.tokenizer)))
    if a.cmd == "cases":
        cases = [{"text": t, "pieces": ref.pre(t) if "<|" not in t and ref.sp is None else None,
                  "ids": ref.encode(t)} for t in TRICKY]
        with open(a.out, "w") as f:
            json.dump(cases, f, ensure_ascii=False, indent=1)
        return 0
    rng = random.Random(a.seed)
    texts = [random_text(rng) for _ in range(a.n)]
    inp = "\n".join(json.dumps({"text": t}) for t in texts) + "\n"
    p = subprocess.run([a.slideformer, "tokenize", "--tokenizer", a.tokenizer, "--jsonl", "-"], input=inp,
                       capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr)
        return 1
    got = [json.loads(line)["ids"] for line in p.stdout.splitlines() if line.startswith("{\"ids\"")]
    bad = 0
    for t, g in zip(texts, got):
        want = ref.encode(t)
        if g != want:
            bad += 1
            if bad <= 5:
                print(f"DIFF {t!r}\n  want {want}\n  got  {g}")
    print(f"{len(texts)} texts, {bad} differ")
    return 1 if bad or len(got) != len(texts) else 0


if __name__ == "__main__":
    sys.exit(main())
