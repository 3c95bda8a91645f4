#!/usr/bin/env python3
"""`slideformer train` against PyTorch (transformers model + torch.optim.AdamW).

    python3 tools/hf_train_compare.py --bin build/slideformer --device cpu  [--work DIR]
    python3 tools/hf_train_compare.py --bin build/slideformer --device cuda [--work DIR]

(a) steps: 3 AdamW steps on tiny fp32 checkpoints (tools/make_tiny_models.py TRAIN_MODELS), --no-shuffle,
    lr 1e-3, weight decay 0.1, betas (0.9, 0.999), eps 1e-8, ragged partly masked records (one fully
    masked), gradient accumulation, data wrapping around the file. Cases:
        llama_clip_linear      B=2 K=2, warmup 1, linear,   clipping on (max norm = half the step-0 norm)
        qwen3_noclip_linear    B=2 K=2, warmup 1, linear,   no clipping
        qwen2_noclip_cosine    B=3 K=1, warmup 1, cosine,   no clipping (q/k/v biases, tied)
        mistral_clip_constant  B=1 K=3, warmup 0, constant, clipping on
    Reference: the same HF checkpoint in fp32 (TF32 off), each optimizer step's loss = sum of per-token CE
    over its K micro-batches / that step's trained-token count, torch.nn.utils.clip_grad_norm_,
    torch.optim.AdamW on all parameters, lr = lr * lambda(step) with transformers' schedule lambdas
    (get_{constant,linear,cosine}_schedule_with_warmup, num_training_steps = --steps).
    Checks: per-step loss and lr printed by slideformer, output tensor names/dtypes equal the input
    checkpoint's, output loads in transformers, per-tensor ||W_sf - W_ref|| / ||W_ref||
    <= 5e-4 (cpu) / 5e-3 (cuda). The relative error of the update itself is printed for information.
    On cuda, k_proj.bias is reported but not gated (its gradient nearly vanishes, so bf16 noise picks
    the sign of AdamW's +-lr steps there; see check_output_dir).

(b) curve (default on for --device cuda, --curve to force): a 4-layer Llama (hidden 256, vocab 512)
    trained 100 steps (B=8, T=256, lr 1e-3, warmup 10, cosine, wd 0.1, clip 1.0) on a fixed token stream
    from a sparse Markov chain (learnable: the loss falls from ~6.3 to ~1.4 nats), slideformer vs
    PyTorch (same HF model, bf16 autocast on CUDA, fp32 master weights, fp32 AdamW, same data order and
    schedule). Check: mean over steps 11..100 of |loss_sf - loss_ref| / loss_ref <= 1 %.

Progress lines are parsed from stdout+stderr: any line with `step N[/M]` and `loss X` (and optionally
`lr Y`), e.g. `step 12/100 loss 3.1234 lr 1.0e-03 tok/s 1234`, or a JSON object with "step" and "loss".
Exit status: 0 all checks pass, 1 any miss.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_models as tiny  # noqa: E402
import hf_parity as hp  # noqa: E402
from hf_parity import log  # noqa: E402

TOL = {
    "cpu": {"weights": 5e-4, "loss": 1e-4},
    "cuda": {"weights": 5e-3, "loss": 2e-2},
}
CURVE_TOL = 0.01
LR_PRINT_TOL = 0.06  # printed lr may have only two significant digits (1.0e-03)

ADAM = dict(lr=1e-3, wd=0.1, beta1=0.9, beta2=0.999, eps=1e-8)

CASES = [
    dict(name="llama_clip_linear", model="train_llama_gqa_tied", B=2, K=2, S=32, n_rec=8, warmup=1,
         sched="linear", clip="auto"),
    dict(name="qwen3_noclip_linear", model="train_qwen3_qknorm", B=2, K=2, S=32, n_rec=8, warmup=1,
         sched="linear", clip=0.0),
    dict(name="qwen2_noclip_cosine", model="train_qwen2_bias_tied", B=3, K=1, S=32, n_rec=6, warmup=1,
         sched="cosine", clip=0.0),
    dict(name="mistral_clip_constant", model="train_mistral_gqa", B=1, K=3, S=32, n_rec=6, warmup=0,
         sched="constant", clip="auto"),
    # Gemma 3: window 7 < S, local and global layers
    dict(name="gemma3_clip_cosine", model="train_gemma3_small", B=2, K=2, S=32, n_rec=8, warmup=1,
         sched="cosine", clip="auto"),
    # mixture of experts (without the load-balancing loss: its batch coupling is hf_parity's aux models)
    dict(name="qwen3moe_clip_linear", model="train_qwen3moe_noaux", B=2, K=2, S=32, n_rec=8, warmup=1,
         sched="linear", clip="auto"),
    dict(name="olmoe_noclip_cosine", model="train_olmoe_noaux", B=2, K=1, S=32, n_rec=6, warmup=1,
         sched="cosine", clip=0.0),
]
STEPS = 3

CURVE = dict(B=8, S=256, steps=100, lr=1e-3, wd=0.1, warmup=10, sched="cosine", clip=1.0, n_rec=800)


# ----------------------------------------------------------------------------------------------
# Schedules (transformers' lambdas, step = 0-based optimizer step)
# ----------------------------------------------------------------------------------------------

def lr_lambda(sched: str, warmup: int, total: int):
    def constant(s):
        return s / max(1.0, warmup) if s < warmup else 1.0

    def linear(s):
        if s < warmup:
            return s / max(1, warmup)
        return max(0.0, (total - s) / max(1, total - warmup))

    def cosine(s):
        if s < warmup:
            return s / max(1, warmup)
        prog = (s - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * prog)))

    return {"constant": constant, "linear": linear, "cosine": cosine}[sched]


def check_lambdas_against_transformers():
    """Cross-checks lr_lambda with transformers' own schedulers (if importable)."""
    try:
        import torch
        from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                                  get_linear_schedule_with_warmup)
    except Exception as e:
        log(f"  (transformers schedulers not importable: {e}; using built-in formulas)")
        return
    for sched, warmup, total in [("linear", 1, 3), ("cosine", 1, 3), ("constant", 0, 3), ("constant", 2, 5),
                                 ("cosine", 10, 100), ("linear", 10, 100)]:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=1.0)
        if sched == "linear":
            s = get_linear_schedule_with_warmup(opt, warmup, total)
        elif sched == "cosine":
            s = get_cosine_schedule_with_warmup(opt, warmup, total)
        else:
            s = get_constant_schedule_with_warmup(opt, warmup)
        lam = lr_lambda(sched, warmup, total)
        for step in range(total):
            hf = opt.param_groups[0]["lr"]
            if abs(hf - lam(step)) > 1e-12:
                raise SystemExit(f"schedule formula mismatch vs transformers: {sched} warmup {warmup} "
                                 f"step {step}: {lam(step)} vs {hf} (bug in hf_train_compare.py)")
            opt.step()
            s.step()


# ----------------------------------------------------------------------------------------------
# Reference training
# ----------------------------------------------------------------------------------------------

def micro_batches(recs, step, B, K):
    n = len(recs)
    return [[recs[((step * K + j) * B + i) % n] for i in range(B)] for j in range(K)]


def grad_norm_step0(model, recs, B, K, S, device, autocast=False):
    model.zero_grad(set_to_none=True)
    micro = micro_batches(recs, 0, B, K)
    N = sum(hp.count_trained(m, S) for m in micro)
    for m in micro:
        ce, _ = hp.batch_ce_sum(model, m, S, device, autocast)
        if ce is not None:
            (ce / N).backward()
    tot = 0.0
    for p in model.parameters():
        if p.grad is not None:
            tot += float(p.grad.double().pow(2).sum())
    model.zero_grad(set_to_none=True)
    return math.sqrt(tot)


def reference_train(model, recs, steps, B, K, S, lr, wd, beta1, beta2, eps, warmup, sched, clip, device,
                    autocast=False, log_every=0):
    import torch
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
    lam = lr_lambda(sched, warmup, steps)
    hist = []
    t0 = time.time()
    for s in range(steps):
        micro = micro_batches(recs, s, B, K)
        N = sum(hp.count_trained(m, S) for m in micro)
        if N == 0:
            raise RuntimeError(f"reference step {s} has no trained token (bad test data)")
        cur = lr * lam(s)
        for g in opt.param_groups:
            g["lr"] = cur
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for m in micro:
            ce, _ = hp.batch_ce_sum(model, m, S, device, autocast)
            if ce is None:
                continue
            (ce / N).backward()
            total += float(ce.detach().double())
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        opt.step()
        hist.append(dict(loss=total / N, lr=cur, gnorm=float(norm), tokens=N))
        if log_every and (s % log_every == 0 or s == steps - 1):
            log(f"    ref step {s + 1}/{steps} loss {total / N:.4f} lr {cur:.3e} |g| {float(norm):.3f} "
                f"({time.time() - t0:.1f} s)")
    return hist


# ----------------------------------------------------------------------------------------------
# Progress parsing
# ----------------------------------------------------------------------------------------------

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf(?:inity)?)"
STEP_RE = re.compile(r"\bstep\b\s*[:=#]?\s*(\d+)(?:\s*/\s*(\d+))?", re.I)
LOSS_RE = re.compile(r"\bloss\b\s*[:=]?\s*" + _NUM, re.I)
LR_RE = re.compile(r"\blr\b\s*[:=]?\s*" + _NUM, re.I)


def parse_progress(text: str, total_steps: int) -> dict[int, dict]:
    """{0-based step: {"loss": x, "lr": y or None}} from progress lines (the last line per step wins)."""
    raw = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{") and line.endswith("}"):
            try:
                v = json.loads(line)
                if isinstance(v, dict) and "step" in v and "loss" in v:
                    raw.append((int(v["step"]), float(v["loss"]),
                                float(v["lr"]) if v.get("lr") is not None else None, 0.0))
                    continue
            except (ValueError, TypeError):
                pass
        ms, ml = STEP_RE.search(line), LOSS_RE.search(line)
        if not ms or not ml:
            continue
        mr = LR_RE.search(line)
        raw.append((int(ms.group(1)), float(ml.group(1)), float(mr.group(1)) if mr else None,
                    print_quantum(ml.group(1))))
    if not raw:
        return {}
    steps = [r[0] for r in raw]
    zero_based = min(steps) == 0  # `step 0/N` seen: 0-based numbering, else 1-based
    out = {}
    for st, loss, lr, q in raw:
        idx = st if zero_based else st - 1
        if 0 <= idx < total_steps:
            out[idx] = {"loss": loss, "lr": lr, "quantum": q}
    return out


def print_quantum(s: str) -> float:
    """Half a unit in the last printed digit of a number ("3.1234" -> 5e-5, "1.0e-03" -> 5e-5)."""
    s = s.strip().lower()
    m = re.fullmatch(r"[-+]?(\d*)(?:\.(\d*))?(?:e([-+]?\d+))?", s)
    if not m:
        return 0.0
    decimals = len(m.group(2) or "")
    exp = int(m.group(3) or 0)
    return 0.5 * 10.0 ** (exp - decimals)


# ----------------------------------------------------------------------------------------------
# (a) 3-step comparison
# ----------------------------------------------------------------------------------------------

def train_args(a, entry_path, data, out, steps, B, K, S, lr, wd, beta1, beta2, eps, warmup, sched, clip,
               device):
    return [a.bin, "train", "--model", entry_path, "--data", data, "--output", out,
            "--steps", str(steps), "--lr", repr(lr), "--batch-size", str(B), "--seq-len", str(S),
            "--grad-accum", str(K), "--weight-decay", repr(wd), "--beta1", repr(beta1),
            "--beta2", repr(beta2), "--eps", repr(eps), "--warmup-steps", str(warmup),
            "--lr-schedule", sched, "--max-grad-norm", repr(clip), "--seed", "0", "--no-shuffle",
            "--device", device]


def compare_progress(table, group, parsed, hist, loss_tol, first_step=0, require_all=True):
    steps = len(hist)
    have = sorted(k for k in parsed if k >= first_step)
    if not have:
        table.add(group, "progress lines", 0, steps, False, "no line with 'step N' and 'loss X' found")
        return
    if require_all:
        missing = [s + 1 for s in range(first_step, steps) if s not in parsed]
        table.add(group, "progress lines", len(have), steps - first_step, not missing,
                  f"missing steps {missing[:5]}" if missing else "")
    # The tolerance grows by the rounding of the printed number (e.g. 4 decimals of a small loss).
    worst, ws, worst_tol, ok = 0.0, None, loss_tol, True
    for s in have:
        r = hp.rel_err(parsed[s]["loss"], hist[s]["loss"])
        t = loss_tol + parsed[s].get("quantum", 0.0) / max(abs(hist[s]["loss"]), 1e-30)
        ok = ok and r <= t
        if ws is None or not r / t <= worst / worst_tol:
            worst, ws, worst_tol = r, s, t
    table.add(group, "per-step loss max rel", worst, worst_tol, ok,
              f"step {ws + 1}: sf {parsed[ws]['loss']:.6f} ref {hist[ws]['loss']:.6f}" if ws is not None else "")
    bad_lr = []
    n_lr = 0
    for s in have:
        lr = parsed[s]["lr"]
        if lr is None:
            continue
        n_lr += 1
        ref = hist[s]["lr"]
        ok = abs(lr) < 1e-12 if ref == 0 else abs(lr - ref) <= LR_PRINT_TOL * abs(ref)
        if not ok:
            bad_lr.append((s + 1, lr, ref))
    if n_lr:
        table.add(group, "per-step lr (schedule)", len(bad_lr), 0, not bad_lr,
                  "; ".join(f"step {s}: sf {x:.3e} ref {y:.3e}" for s, x, y in bad_lr[:3]) +
                  (" (transformers' warmup: lr*step/warmup, so step 1 has lr 0)" if bad_lr else ""))


def check_output_dir(table, group, out_dir: Path, entry, ref_model, w0, tol_w, arch, device):
    import torch
    if not (out_dir / "config.json").exists():
        table.add(group, "output dir", None, None, False, f"{out_dir}/config.json missing")
        return
    try:
        got, dtypes = hp.load_safetensors_dir(out_dir)
    except Exception as e:
        table.add(group, "output readable", None, None, False, f"{type(e).__name__}: {e}")
        return
    want = entry["file_tensors"]  # name -> dtype of the input checkpoint
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    table.add(group, "output names = input's", len(got), len(want), not missing and not extra,
              (f"missing {missing[:3]} " if missing else "") + (f"extra {extra[:3]}" if extra else ""))
    bad_dt = [k for k in got if k in want and dtypes[k] != want[k]]
    table.add(group, "output dtype = input's", len(bad_dt), 0, not bad_dt,
              f"{bad_dt[0]}: {dtypes[bad_dt[0]]} vs {want[bad_dt[0]]}" if bad_dt else "")
    # transformers v5's fused MoE experts under the checkpoint's per-expert names (hf_parity.py)
    ref_sd = hp.to_file_names(ref_model.state_dict(), entry.get("file_shapes") or {})
    per, upd = [], []
    for k in sorted(set(got) & set(ref_sd)):
        a_ = got[k].double()
        r_ = ref_sd[k].detach().double().cpu()
        if a_.shape != r_.shape:
            per.append((math.inf, k))
            continue
        d = float((a_ - r_).norm())
        per.append((d / max(float(r_.norm()), 1e-30) if math.isfinite(d) else math.inf, k))
        du = float((r_ - w0[k]).norm())
        if du > 0:
            upd.append((float(((a_ - w0[k]) - (r_ - w0[k])).norm()) / du, k))
    per.sort(reverse=True)
    upd.sort(reverse=True)
    # On cuda, k_proj.bias is reported but not gated: its gradient nearly vanishes (softmax ignores a
    # per-query constant shift; only RoPE's slow rotation breaks that), so bf16 round-off sets the
    # sign of many of its elements and AdamW turns each into a full +-lr step.
    info_only = {k for _, k in per if device == "cuda" and k.endswith("k_proj.bias")}
    gated = [(r, k) for r, k in per if k not in info_only]
    n_bad = sum(1 for r, _ in gated if not r <= tol_w)
    if gated:
        table.add(group, "weights max rel (per tensor)", gated[0][0], tol_w, n_bad == 0,
                  f"worst {gated[0][1]}; {n_bad}/{len(gated)} over")
        for r, k in (gated if n_bad else gated[:2]):
            log(f"      {'OVER ' if not r <= tol_w else '     '}{r:.3e}  {k}")
    if info_only:
        worst_i = max((r, k) for r, k in per if k in info_only)
        table.add(group, "(info) k_proj.bias weights rel", worst_i[0], None, True, f"worst {worst_i[1]}")
    if upd:
        log(f"      (info) update rel err, worst {upd[0][0]:.3e} at {upd[0][1]}; median "
            f"{upd[len(upd) // 2][0]:.3e}")
    try:
        m = tiny.load_hf_model(out_dir, arch, device="cpu")
        sd = hp.to_file_names(m.state_dict(), entry.get("file_shapes") or {})
        diff = [k for k in got if k in sd and not torch.equal(sd[k].float(), got[k].float())]
        table.add(group, "output loads in transformers", len(diff), 0, not diff,
                  f"values differ after load: {diff[:3]}" if diff else "")
    except Exception as e:
        table.add(group, "output loads in transformers", None, None, False, f"{type(e).__name__}: {e}")


def run_case(case, a, table, work: Path, idx: int):
    tol = TOL[a.device]
    group = case["name"]
    spec = tiny.TRAIN_MODELS[case["model"]]
    log(f"\n== (a) {group}: {spec['arch']} B={case['B']} K={case['K']} seq {case['S']} "
        f"{case['n_rec']} records, {STEPS} steps, {case['sched']} warmup {case['warmup']}")
    entry = tiny.build_model(case["model"], spec, work, a.seed + 1000 + 17 * idx)
    data = work / "data" / f"{group}.jsonl"
    recs = tiny.make_train_records(entry["vocab_size"], a.seed + 2000 + idx, case["n_rec"], case["S"])
    tiny.write_jsonl(data, recs)

    dev = a.ref_device
    model = tiny.load_hf_model(entry["path"], spec["arch"], device=dev, attn="eager")
    model.eval()  # no dropout; gradients as in train mode
    clip = case["clip"]
    if clip == "auto":
        n0 = grad_norm_step0(model, recs, case["B"], case["K"], case["S"], dev)
        clip = float(f"{0.5 * n0:.3g}")
        log(f"  step-0 grad norm {n0:.4f} -> --max-grad-norm {clip!r}")
    w0 = {k: v.detach().double().cpu().clone()
          for k, v in hp.to_file_names(model.state_dict(), entry.get("file_shapes") or {}).items()}
    hist = reference_train(model, recs, STEPS, case["B"], case["K"], case["S"], ADAM["lr"], ADAM["wd"],
                           ADAM["beta1"], ADAM["beta2"], ADAM["eps"], case["warmup"], case["sched"], clip, dev)
    for s, h in enumerate(hist):
        log(f"  ref step {s + 1}: loss {h['loss']:.6f} lr {h['lr']:.3e} |g| {h['gnorm']:.4f} "
            f"tokens {h['tokens']}{'  (clipped)' if clip > 0 and h['gnorm'] > clip else ''}")
    if clip > 0 and not any(h["gnorm"] > clip for h in hist):
        log("  note: clipping never active in the reference")

    out = work / "out" / group
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = train_args(a, entry["path"], str(data), str(out), STEPS, case["B"], case["K"], case["S"],
                      ADAM["lr"], ADAM["wd"], ADAM["beta1"], ADAM["beta2"], ADAM["eps"], case["warmup"],
                      case["sched"], clip, a.device)
    rc, so, se, dt = hp.run_cli(argv, a.timeout)
    if rc != 0:
        table.add(group, "train", None, None, False, f"exit {rc}")
        return
    parsed = parse_progress(so + "\n" + se, STEPS)
    compare_progress(table, group, parsed, hist, tol["loss"])
    check_output_dir(table, group, out, entry, model, w0, tol["weights"], spec["arch"], a.device)


# ----------------------------------------------------------------------------------------------
# (b) 100-step loss curve
# ----------------------------------------------------------------------------------------------

def make_curve_records(vocab: int, n: int, seq: int, seed: int) -> list[dict]:
    """A fixed token stream from a sparse Markov chain (4 successors per token, probabilities
    .55/.25/.15/.05: ~1.1 nats entropy), cut into n records of seq tokens."""
    import numpy as np
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, vocab, size=(vocab, 4))
    total = n * seq
    choice = rng.choice(4, size=total, p=[0.55, 0.25, 0.15, 0.05])
    stream = np.empty(total, dtype=np.int64)
    t = int(rng.integers(0, vocab))
    for i in range(total):
        stream[i] = t
        t = int(succ[t, choice[i]])
    return [{"input_ids": stream[i * seq:(i + 1) * seq].tolist()} for i in range(n)]


def run_curve(a, table, work: Path):
    import torch
    c = CURVE
    group = "curve_100"
    steps = a.curve_steps
    log(f"\n== (b) loss curve: {steps} steps, B={c['B']} T={c['S']}, lr {c['lr']} {c['sched']} "
        f"warmup {c['warmup']} wd {c['wd']} clip {c['clip']}")
    entry = tiny.build_model("curve_llama", tiny.CURVE_MODEL, work, a.seed + 5000)
    data = work / "data" / "curve.jsonl"
    recs = make_curve_records(entry["vocab_size"], c["n_rec"], c["S"], a.seed + 5001)
    tiny.write_jsonl(data, recs)

    dev = "cuda" if a.device == "cuda" else "cpu"
    autocast = a.device == "cuda"
    torch.manual_seed(0)
    model = tiny.load_hf_model(entry["path"], entry["arch"], device=dev, attn="sdpa" if autocast else "eager")
    model.train()
    t0 = time.time()
    hist = reference_train(model, recs, steps, c["B"], 1, c["S"], c["lr"], c["wd"], ADAM["beta1"],
                           ADAM["beta2"], ADAM["eps"], c["warmup"], c["sched"], c["clip"], dev,
                           autocast=autocast, log_every=10)
    log(f"  reference: {time.time() - t0:.1f} s, loss {hist[0]['loss']:.4f} -> {hist[-1]['loss']:.4f}")
    fell = hist[-1]["loss"] < 0.7 * hist[0]["loss"]
    table.add(group, "reference loss falls (last/first)", hist[-1]["loss"] / hist[0]["loss"], 0.7, fell,
              "test data must be learnable" if not fell else "")
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()

    out = work / "out" / group
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = train_args(a, entry["path"], str(data), str(out), steps, c["B"], 1, c["S"], c["lr"], c["wd"],
                      ADAM["beta1"], ADAM["beta2"], ADAM["eps"], c["warmup"], c["sched"], c["clip"], a.device)
    rc, so, se, dt = hp.run_cli(argv, a.timeout)
    if rc != 0:
        table.add(group, "train", None, None, False, f"exit {rc}")
        return
    log(f"  slideformer: {dt:.1f} s wall")
    parsed = parse_progress(so + "\n" + se, steps)
    first = min(10, steps - 1)
    after = [s for s in range(first, steps) if s in parsed]
    table.add(group, "progress lines (steps 11..)", len(after), steps - first, len(after) >= 0.9 * (steps - first),
              "slideformer must print a progress line per step")
    log(f"  {'step':>5s} {'slideformer':>12s} {'pytorch':>10s} {'rel':>9s}")
    for s in range(steps):
        if s in parsed and (s % 10 == 0 or s == steps - 1 or s < 3):
            log(f"  {s + 1:5d} {parsed[s]['loss']:12.5f} {hist[s]['loss']:10.5f} "
                f"{hp.rel_err(parsed[s]['loss'], hist[s]['loss']):9.2e}")
    if not after:
        table.add(group, "mean rel loss diff (steps 11..)", None, CURVE_TOL, False, "no parsed steps")
        return
    rels = [hp.rel_err(parsed[s]["loss"], hist[s]["loss"]) for s in after]
    mean_rel = sum(rels) / len(rels)
    table.add(group, "mean rel loss diff (steps 11..)", mean_rel, CURVE_TOL, mean_rel <= CURVE_TOL,
              f"max {max(rels):.2e}; first-step rel "
              f"{hp.rel_err(parsed[0]['loss'], hist[0]['loss']) if 0 in parsed else float('nan'):.2e}")
    bad_lr = [(s + 1, parsed[s]["lr"], hist[s]["lr"]) for s in sorted(parsed) if parsed[s]["lr"] is not None and
              not (abs(parsed[s]["lr"]) < 1e-12 if hist[s]["lr"] == 0 else
                   abs(parsed[s]["lr"] - hist[s]["lr"]) <= LR_PRINT_TOL * abs(hist[s]["lr"]))]
    if any(parsed[s]["lr"] is not None for s in parsed):
        table.add(group, "per-step lr (schedule)", len(bad_lr), 0, not bad_lr,
                  "; ".join(f"step {s}: sf {x:.3e} ref {y:.3e}" for s, x, y in bad_lr[:3]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="path of the slideformer binary")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--ref-device", choices=["cpu", "cuda"], default="cpu",
                    help="where the fp32 reference of part (a) runs (default cpu)")
    ap.add_argument("--work", default=None, help="work folder (default: a new temporary folder)")
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--cases", default="", help="comma-separated subset of part (a) case names")
    ap.add_argument("--skip-steps", action="store_true", help="skip part (a)")
    ap.add_argument("--skip-curve", action="store_true", help="skip part (b)")
    ap.add_argument("--curve", action="store_true", help="run part (b) also with --device cpu (fp32 reference)")
    ap.add_argument("--curve-steps", type=int, default=CURVE["steps"])
    ap.add_argument("--timeout", type=float, default=600, help="seconds per CLI call")
    ap.add_argument("--cli-args", default="", help="extra slideformer options, e.g. '--offload --slots 2'")
    ap.add_argument("--weights-tol", type=float, default=None, help="override the part (a) weight tolerance")
    a = ap.parse_args(argv)
    hp.CLI_EXTRA[:] = shlex.split(a.cli_args)

    a.bin = str(Path(a.bin).resolve())
    if not os.access(a.bin, os.X_OK):
        log(f"--bin {a.bin}: not an executable file")
        return 2
    if a.weights_tol is not None:
        TOL[a.device]["weights"] = a.weights_tol
    hp.setup_torch("cuda" if (a.device == "cuda" or a.ref_device == "cuda") else "cpu")
    import torch
    import transformers
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {a.device}, "
        f"tolerances {TOL[a.device]}, curve {CURVE_TOL}")
    check_lambdas_against_transformers()
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="sf_train_cmp_"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"work folder {work}")

    table = hp.Table()
    if not a.skip_steps:
        only = [x for x in a.cases.split(",") if x]
        for i, case in enumerate(CASES):
            if only and case["name"] not in only:
                continue
            try:
                run_case(case, a, table, work, i)
            except Exception as e:
                import traceback
                traceback.print_exc()
                table.add(case["name"], "harness", None, None, False, f"{type(e).__name__}: {e}")
    if not a.skip_curve and (a.device == "cuda" or a.curve):
        try:
            run_curve(a, table, work)
        except Exception as e:
            import traceback
            traceback.print_exc()
            table.add("curve_100", "harness", None, None, False, f"{type(e).__name__}: {e}")

    if not table.rows:
        log("nothing was run")
        return 2
    table.print(f"hf_train_compare --device {a.device}  (slideformer vs PyTorch AdamW; work {work})")
    return 1 if table.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
