#!/usr/bin/env python3
"""Replays the recorded apply_chat_template corpus (tests/data/chat_corpus/*.jsonl, recorded by
tools/chat_template_parity.py --record on the GPU machine) through `slideformer tokenize` with the
real tokenizers (tmp/tokenizers, from `tokenizer_parity.py fetch tmp/tokenizers --gzip` and
`chat_template_parity.py --fetch`): token ids and assistant masks must equal transformers' on every
conversation, refusals where transformers raised.
Usage: python3 tools/chat_corpus_check.py tests/data/chat_corpus/transformers.jsonl build/slideformer"""
import json, sys, os, gzip, subprocess, tempfile
corpus, binary = sys.argv[1], sys.argv[2]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
bad = {}; tot = {}
work = tempfile.mkdtemp()
recs = [json.loads(l) for l in open(corpus)]
tk = {r["template"]: r["tokenizer"] for r in recs if r.get("tokenizer")}
for r in recs: r["tokenizer"] = tk.get(r["template"])
recs = [r for r in recs if os.path.exists(f"{root}/tests/data/chat_templates/{r['template']}")]
by = {}
for r in recs: by.setdefault((r["template"], r.get("tokenizer"), r.get("bos"), r.get("eos")), []).append(r)
for (tpl, tok, bos, eos), rs in by.items():
    d = os.path.join(work, tpl + tok); os.makedirs(d, exist_ok=True)
    if tok: open(os.path.join(d, "tokenizer.json"), "wb").write(gzip.open(f"{root}/tmp/tokenizers/{tok}.json.gz").read())
    template = open(f"{root}/tests/data/chat_templates/{tpl}").read()
    # Templates that print today's date (Llama 3.1/3.2) were recorded on their day: the replay renders
    # that day's date (the recorded one, put in place of strftime_now's call) instead of today's.
    day = next((r["text"].split("Today Date: ", 1)[1][:11] for r in rs if "Today Date: " in r.get("text", "")), None)
    if day:
        template = template.replace('strftime_now("%d %b %Y")', json.dumps(day))
    cfg = {"chat_template": template, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}
    if bos is not None: cfg["bos_token"] = bos
    json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))
    for r in rs:
        p = os.path.join(work, "one.jsonl")
        open(p, "w").write(json.dumps({"messages": r["messages"]}) + "\n")
        o = subprocess.run([binary, "tokenize", "--model", d, "--jsonl", p], capture_output=True, text=True)
        tot[tpl] = tot.get(tpl, 0) + 1
        if "error" in r:
            if o.returncode == 0: bad[tpl] = bad.get(tpl, 0) + 1; print(tpl, "expected error", r["error"][:100])
            continue
        if o.returncode != 0:
            bad[tpl] = bad.get(tpl, 0) + 1; print(tpl, "refused:", o.stderr.strip()[:200]); continue
        j = json.loads(o.stdout.strip().splitlines()[-1])
        mask = [int(l != -100) for l in j["labels"]]
        ok = j["ids"] == r["ids"] and mask == r["mask"]
        if not ok:
            bad[tpl] = bad.get(tpl, 0) + 1
            print(tpl, json.dumps(r["messages"])[:200]); print("  ids equal", j["ids"] == r["ids"]); print("  ours", "".join(map(str, mask))); print("  ref ", "".join(map(str, r["mask"])))
for t in tot: print(f"{t}: {bad.get(t,0)} of {tot[t]} differ")
sys.exit(1 if bad else 0)
