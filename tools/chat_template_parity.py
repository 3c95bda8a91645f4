#!/usr/bin/env python3
"""slideformer's chat records against transformers' apply_chat_template (run where transformers is
installed, e.g. the GPU machine).

  chat_template_parity.py --bin SLIDEFORMER [--tokenizers DIR] [--show 3] [--jinja2-text-only]

For each real chat template in tests/data/chat_templates paired with its family's real
tokenizer.json (DIR/<name>.json or .json.gz, as `tools/tokenizer_parity.py fetch DIR --gzip`
writes them; default tmp/tokenizers), and for several conversations (system / no system, multi-turn,
empty content, Unicode, whitespace, Qwen3 reasoning), it builds a model directory
(tokenizer.json + tokenizer_config.json with the template), runs `slideformer tokenize --model DIR
--jsonl` and compares with transformers:
  - text: apply_chat_template(messages, tokenize=False);
  - ids: apply_chat_template(messages, tokenize=True) (the rendered text without added special tokens);
  - masks: for a template with {% generation %} blocks, transformers' own
    return_assistant_tokens_mask; for the real templates (which have none), the same documented
    method slideformer uses (src/data/chat.h), implemented here in Python over transformers'
    renderings and the fast tokenizer's offsets.
A conversation that the template refuses (raise_exception) must be refused by both. Exit 0 when
nothing differs.

--jinja2-text-only (no transformers needed, only jinja2): compares the rendered text alone with
jinja2 set up as transformers sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its tojson, raise_exception and strftime_now).
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "tests", "data", "chat_templates")

# template file -> (tokenizer file stem, bos, eos)
PAIRS = {
    "llama3.jinja": ("llama3", "<|begin_of_text|>", "<|end_of_text|>"),
    "llama3.1.jinja": ("llama3_1", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2.jinja": ("llama3_1", "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5.jinja": ("qwen3", None, "<|im_end|>"),
    "qwen3.jinja": ("qwen3", None, "<|im_end|>"),
    "mistral-v0.1.jinja": ("mistral-7b-v0.1", "<s>", "</s>"),
    "mistral-v0.3.jinja": ("mistral-7b-v0.1", "<s>", "</s>"),
    # A template with generation markers: masks compared with transformers' own.
    "generation": ("qwen3", None, "<|im_end|>"),
}

GENERATION_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' %}{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}"
    "{%- else %}{{- message.content + '<|im_end|>' }}{%- endif %}"
    "{{- '\\n' }}"
    "{%- endfor %}"
)


def conversations():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    s = lambda c: {"role": "system", "content": c}  # noqa: E731
    return [
        [s("You are a helpful assistant."), u("Hello!"), a("Hi! How can I help you today?")],
        [u("What is 2+2?"), a("4"), u("And 3+3?"), a("6")],
        [s("Be brief."), u("Name a color."), a("Blue."), u("Another?"), a("Red.")],
        [u("  padded question \n"), a("  padded answer\n\n")],
        [u("Empty answer please"), a("")],
        [u("héllo wörld 日本語 😀 👨‍👩‍👧 Привет"), a("Ça va? 你好! ✨ \u00a0nbsp")],
        [u("code?"), a("```python\ndef f(x):\n    return x * 2\n```\nDone.")],
        [u("Think first"), a("<think>\nLet me think.\n</think>\n\nThe answer is 42.")],
        [u("q1"), a("<think>\nr1\n</think>\n\nA1"), u("q2"), a("<think>\nr2\n</think>\n\nA2")],
        [u("literal <|im_start|> and [INST] and <s> in text"), a("ok </s> <|eot_id|>")],
        [s("sys"), u("Weather in Zürich?"),
         {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
             "name": "get_weather", "arguments": {"city": "Zürich", "days": 3, "opts": {"x": [1.5, True, None]}}}}]},
         {"role": "tool", "content": "sunny"}, a("It is sunny.")],
    ]


def tokenizer_file(tok_dir, stem, work):
    for name in (stem + ".json", stem + ".json.gz"):
        p = os.path.join(tok_dir, name)
        if os.path.exists(p):
            if name.endswith(".gz"):
                out = os.path.join(work, stem + ".json")
                with gzip.open(p, "rb") as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                return out
            return p
    return None


def make_model_dir(work, name, tok_path, template, bos, eos):
    d = os.path.join(work, name.replace(".", "_"))
    os.makedirs(d, exist_ok=True)
    shutil.copy(tok_path, os.path.join(d, "tokenizer.json"))
    cfg = {"chat_template": template, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if bos is not None:
        cfg["bos_token"] = bos
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def ours(binary, model_dir, messages, work):
    p = os.path.join(work, "one.jsonl")
    with open(p, "w") as f:
        f.write(json.dumps({"messages": messages}) + "\n")
    r = subprocess.run([binary, "tokenize", "--model", model_dir, "--jsonl", p], capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip()}
    return json.loads(r.stdout.strip().splitlines()[-1])


def reference_mask(tok, messages, text, ids):
    """slideformer's method (src/data/chat.h) over transformers' renderings."""
    render = lambda msgs, gen: tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)  # noqa: E731
    spans = []

    def overlap(a, b):  # longest suffix of a that b starts with
        for k in range(min(len(a), len(b)), 0, -1):
            if b.startswith(a[len(a) - k:]):
                return k
        return 0

    def common(a, b):
        k = 0
        while k < len(a) and k < len(b) and a[k] == b[k]:
            k += 1
        return k

    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(messages[:i], True) if i > 0 else None
        if before is not None and text.startswith(before):
            upto = render(messages[: i + 1], False)
            s = len(before)
            if text.startswith(upto) and len(upto) >= s:
                e = len(upto)
            else:
                turn, rest = upto[s:], text[s:]
                n = overlap(turn, rest) or common(turn, rest)
                e = s + n
        else:
            def marked(pre):
                c = [dict(x) for x in messages]
                c[i]["content"] = ("\x02" + (c[i]["content"] or "")) if pre else ((c[i]["content"] or "") + "\x02")
                return render(c, False)
            s = common(text, marked(True))
            e = max(s, common(text, marked(False)))
            eos = tok.eos_token
            if eos and text.startswith(eos, e):
                e += len(eos)
        if e > s:
            spans.append((s, e))
    # spans are in characters of `text`; tokens by their offsets (char_to_token, as transformers)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ids
    offsets = enc["offset_mapping"]

    def char_to_token(c):
        for k, (a, b) in enumerate(offsets):
            if a <= c < b:
                return k
        return None

    mask = [0] * len(ids)
    for s, e in spans:
        a = char_to_token(s)
        b = char_to_token(e - 1)
        if a is None:
            continue
        if b is None:
            b = len(ids) - 1
        for k in range(a, b + 1):
            mask[k] = 1
    return mask


def jinja2_env():
    from datetime import datetime

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(m):
        raise Exception(m)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.now().strftime(f)
    return env


def text_only(a, work):
    env = jinja2_env()
    bad = total = 0
    for name, (stem, bos, eos) in PAIRS.items():
        if name == "generation":
            continue
        tok_path = tokenizer_file(a.tokenizers, stem, work)
        if tok_path is None:
            print(f"{name}: SKIPPED (no {stem}.json[.gz] in {a.tokenizers})")
            bad += 1
            continue
        template = open(os.path.join(TEMPLATES, name)).read()
        d = make_model_dir(work, name, tok_path, template, bos, eos)
        t = env.from_string(template)
        diffs = 0
        for conv in conversations():
            total += 1
            kw = {"messages": conv, "add_generation_prompt": False, "tools": None, "documents": None, "eos_token": eos}
            if bos is not None:
                kw["bos_token"] = bos
            try:
                ref, err = t.render(**kw), None
            except Exception as e:
                ref, err = None, str(e)
            mine = ours(a.bin, d, conv, work)
            if err is not None or "error" in mine:
                same = err is not None and "error" in mine
                if not same:
                    diffs += 1
                    print(f"  {name}: refused by one side only: ours {mine.get('error')!r}, jinja2 {err!r}")
                continue
            if mine["text"] != ref:
                diffs += 1
                print(f"  {name}: {conv}\n    ours {mine['text']!r}\n    ref  {ref!r}")
        print(f"{name}: {diffs} of {len(conversations())} conversations differ (text)")
        bad += diffs
    print(f"total: {bad} differences in {total} conversations")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the slideformer binary")
    ap.add_argument("--tokenizers", default=os.path.join(HERE, "..", "tmp", "tokenizers"))
    ap.add_argument("--show", type=int, default=3)
    ap.add_argument("--jinja2-text-only", action="store_true")
    a = ap.parse_args()
    if a.jinja2_text_only:
        work = tempfile.mkdtemp(prefix="chat_parity_")
        try:
            return text_only(a, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    from transformers import AutoTokenizer  # noqa: E402
    import transformers  # noqa: E402

    print(f"transformers {transformers.__version__}")
    work = tempfile.mkdtemp(prefix="chat_parity_")
    bad = total = 0
    try:
        for name, (stem, bos, eos) in PAIRS.items():
            tok_path = tokenizer_file(a.tokenizers, stem, work)
            if tok_path is None:
                print(f"{name}: SKIPPED (no {stem}.json[.gz] in {a.tokenizers})")
                bad += 1
                continue
            template = GENERATION_TEMPLATE if name == "generation" else open(os.path.join(TEMPLATES, name)).read()
            d = make_model_dir(work, name, tok_path, template, bos, eos)
            tok = AutoTokenizer.from_pretrained(d)
            shown = diffs = 0
            for conv in conversations():
                total += 1
                mine = ours(a.bin, d, conv, work)
                try:
                    text = tok.apply_chat_template(conv, tokenize=False)
                    out = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
                    ref_ids = list(out["input_ids"])
                except Exception as e:  # the template refuses the conversation
                    if "error" not in mine:
                        diffs += 1
                        if shown < a.show:
                            shown += 1
                            print(f"  {name}: transformers refused ({e}), slideformer did not: {conv}")
                    continue
                if "error" in mine:
                    diffs += 1
                    if shown < a.show:
                        shown += 1
                        print(f"  {name}: slideformer refused: {mine['error']}\n    {conv}")
                    continue
                if name == "generation":
                    ref_mask = list(out["assistant_masks"])
                else:
                    ref_mask = reference_mask(tok, conv, text, ref_ids)
                my_mask = [0 if x == -100 else 1 for x in mine["labels"]]
                problems = []
                if mine["text"] != text:
                    problems.append(f"text\n    ours {mine['text']!r}\n    HF   {text!r}")
                if mine["ids"] != ref_ids:
                    problems.append(f"ids\n    ours {mine['ids']}\n    HF   {ref_ids}")
                elif my_mask != ref_mask:
                    problems.append(f"mask\n    ours {''.join(map(str, my_mask))}\n    ref  {''.join(map(str, ref_mask))}")
                if problems:
                    diffs += 1
                    if shown < a.show:
                        shown += 1
                        print(f"  {name}: {conv}\n   " + "\n   ".join(problems))
            print(f"{name}: {diffs} of {len(conversations())} conversations differ")
            bad += diffs
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"total: {bad} differences in {total} conversations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
