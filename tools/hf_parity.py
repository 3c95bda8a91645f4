#!/usr/bin/env python3
"""Whole-model parity of `slideformer eval` / `slideformer grad` against Hugging Face transformers.

    python3 tools/hf_parity.py --bin build/slideformer --device cpu  [--work DIR] [--models a,b]
    python3 tools/hf_parity.py --bin build/slideformer --device cuda [--work DIR]

For each tiny random model of tools/make_tiny_models.py (Llama, Mistral, Qwen2, Qwen3; fp32 and bf16;
single-file and sharded; GQA/MQA/MHA; tied and untied; llama3 RoPE; biases; Qwen3 q/k-norm; the
mixture-of-experts families Qwen3-MoE, Mixtral, OLMoE with the load-balancing loss on and off) and its
ragged, partly masked JSONL file:

  reference   transformers model in fp32 (bf16 checkpoints upcast exactly), eager attention, TF32 off,
              loss = sum over records of per-token CE (reduction='sum') / number of trained targets,
              with the CLI's data rules: each record cut to --seq-len, position t predicts labels[t+1],
              -100 and padding never trained, every record its own sequence from position 0.
              Gradients: backward of that global mean, fp32, per parameter (tied: embed_tokens only).
              Self-check: per record, sum CE equals transformers' own `labels=` loss x count.
  slideformer `eval` at --batch-size B and at 1, `grad` at B; compared on
              loss relative error, token count (exact), grad tensor names (exactly the model's
              parameters), dtype F32 and shapes, "loss" in the grad metadata, and per tensor
              ||g_sf - g_ref|| / ||g_ref||.
  MoE         transformers v5's fused expert parameters are compared under the checkpoint's per-expert
              names (to_file_names). With the load-balancing loss on ("aux" models), the gradient
              reference is one batch of all records with labels= (reference_aux) and `grad` runs them
              as one micro-batch; `eval` is compared with the cross-entropy part (it reports CE only).
  round trip  every model: `train --steps 1 --lr 0` saves tensors equal to the input checkpoint's
              byte for byte, and the output loads in transformers.
  tolerances  cpu: loss 1e-5, grad 1e-4 (fp32 math both sides).
              cuda: PyTorch's own low-precision error is the yardstick (the project's rule): on the same
              models and inputs transformers runs on the GPU in bf16 (all-bf16 weights and activations) and
              with bf16 autocast (fp32 weights); per tensor, slideformer's gradient error against the fp32
              reference must be <= LOWP_FACTOR (2) x the larger of the two, and at least the floor
              LOWP_GRAD_FLOOR (1e-2 relative, ~2.5 bf16 ulps) is allowed where torch happens to land
              closer; the loss likewise (floor LOWP_LOSS_FLOOR, 1e-3: measured losses land within 8e-5).
              Models with the load-balancing loss measure torch with the same one-batch labels= call as
              their reference.
              --grad-tol / --loss-tol (or --no-baseline: 1e-2 / 3e-2) replace the rule by fixed values.
              On cuda the models use initializer_range 0.02 (cpu: 0.1), see CUDA_INIT_RANGE.
              k_proj.bias is measured on the q_proj.bias gradient's scale on cuda (grad_errors()).
  aux loss    transformers' load-balancing loss is checked against its definition, computed here from
              the router inputs captured by hooks (not from what transformers records):
              aux = E * sum_e f_e P_e over all MoE layers' tokens of the call (f_e: share of top-k picks of
              expert e, P_e: mean softmax probability), and loss = CE + router_aux_loss_coef * aux.
              A transformers whose router hands its probabilities to the loss (softmax twice,
              transformers issue 45120) fails that model's row with that reason; anything else: exit 3.
  MoE routing a token whose k-th and (k+1)-th router logits are within bf16 rounding is routed differently
              by any bf16 run (torch's or ours) than by the fp32 reference: its whole contribution moves
              between two experts' gradients (10-30 % of a tiny model's expert gradient), and the two
              runs flip different tokens, so the 2x rule would judge luck. The MoE models' data is
              therefore made with every token's top-k margin >= --route-margin (0.15) x the row's logit
              RMS in the fp32 model (tools/moe_routing.py replaces tokens from the left; the count is
              logged). On cuda an (info) row names the reference's nearest ties (layer, token, the two
              experts at the boundary), and a row per torch mode checks that torch's own bf16 / autocast
              routing equals the reference's (0 flips), showing the largest router-logit error over the
              token's margin (a flip needs 0.5). --route-margin 0 keeps the random tokens (near-ties
              and all) to show what they do.

Prints a table; exit status 0 when every check passes, 1 when any misses, 3 when the reference
itself is inconsistent (a bug of this script). Needs torch, transformers, safetensors, numpy.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_models as tiny  # noqa: E402
import moe_routing  # noqa: E402
from moe_routing import router_modules  # noqa: E402

TOL = {
    "cpu": {"loss": 1e-5, "grad": 1e-4},
    "cuda": {"loss": 1e-2, "grad": 3e-2},  # only with --no-baseline / --grad-tol / --loss-tol
}
# cuda: at most LOWP_FACTOR x PyTorch's own bf16 error on the same inputs, per tensor, with floors.
LOWP_FACTOR = 2.0
LOWP_GRAD_FLOOR = 1e-2
LOWP_LOSS_FLOOR = 1e-3  # losses average over tokens: measured <= 8e-5 (torch bf16), 4.5e-5 (ours), H200
# Weight scale of the tiny models with --device cuda. The CPU check uses make_tiny_models' 0.1 (a "hot"
# network: peaked softmaxes, large activations, so any math slip shows). On such a network bf16 itself
# is off by 3-8 % in the gradients (transformers in bf16 on an H200, measured), above the 3e-2 gate; at
# transformers' default 0.02 it lands at 1.2-2.5 %, which is what the gate is meant for.
CUDA_INIT_RANGE = 0.02
# A tensor whose reference gradient norm is below this fraction of the median tensor norm is compared
# against that floor instead of its own (tiny) norm, so round-off on near-zero gradients can't fail it.
GRAD_NORM_FLOOR = 1e-3


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------------------------
# Shared helpers (also used by hf_train_compare.py)
# ----------------------------------------------------------------------------------------------

def setup_torch(device: str):
    tiny.quiet_transformers()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        torch.set_float32_matmul_precision("highest")
    except Exception:
        pass
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda / --ref-device cuda given but torch sees no GPU")


def record_inputs(rec: dict, seq_len: int) -> tuple[list[int], list[int], int]:
    """(ids, targets, trained) for one record after the cut; targets[t] = labels[t+1], last = -100."""
    ids = list(rec["input_ids"][:seq_len])
    labels = list(rec.get("labels", rec["input_ids"])[:seq_len])
    if len(labels) != len(ids):
        raise ValueError("labels and input_ids differ in length")
    targets = labels[1:] + [-100]
    trained = sum(1 for t in targets if t != -100)
    return ids, targets, trained


def count_trained(recs, seq_len) -> int:
    return sum(record_inputs(r, seq_len)[2] for r in recs)


def record_ce_sum(model, rec, seq_len, device):
    """Sum of per-token cross-entropy of one record (a graph-attached fp32 scalar) or None."""
    import torch
    import torch.nn.functional as F
    ids, targets, trained = record_inputs(rec, seq_len)
    if trained == 0:
        return None, 0
    x = torch.tensor([ids], dtype=torch.long, device=device)
    y = torch.tensor(targets, dtype=torch.long, device=device)
    logits = model(input_ids=x).logits[0].float()
    return F.cross_entropy(logits, y, ignore_index=-100, reduction="sum"), trained


def batch_ce_sum(model, recs, seq_len, device, autocast_bf16=False):
    """Same as summing record_ce_sum over recs, in one right-padded batch (causal: padding never
    influences real positions). Returns (sum CE scalar or None, trained)."""
    import torch
    import torch.nn.functional as F
    rows = [record_inputs(r, seq_len) for r in recs]
    trained = sum(r[2] for r in rows)
    if trained == 0:
        return None, 0
    T = max(len(r[0]) for r in rows)
    x = torch.zeros((len(rows), T), dtype=torch.long)
    y = torch.full((len(rows), T), -100, dtype=torch.long)
    for i, (ids, tg, _) in enumerate(rows):
        x[i, :len(ids)] = torch.tensor(ids)
        y[i, :len(tg)] = torch.tensor(tg)
    x, y = x.to(device), y.to(device)
    if autocast_bf16:
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
    else:
        logits = model(input_ids=x).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss, trained


# Extra slideformer options for every eval/grad/train call (--cli-args, e.g. "--offload --slots 2").
CLI_EXTRA: list[str] = []


def expected_engine() -> str | None:
    """The engine --cli-args asks for ("sliding" with --offload, "resident" with --no-offload):
    eval and grad report theirs, and a parity run meant for one engine must not pass on the other."""
    if "--offload" in CLI_EXTRA:
        return "sliding"
    if "--no-offload" in CLI_EXTRA:
        return "resident"
    return None


def run_cli(argv: list[str], timeout: float, env=None) -> tuple[int, str, str, float]:
    if len(argv) > 1 and argv[1] in ("eval", "grad", "train"):
        argv = [*argv, *CLI_EXTRA]
    log("  $ " + " ".join(shlex.quote(str(a)) for a in argv))
    t0 = time.time()
    try:
        p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=env)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = ((e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
            f"\n[timed out after {timeout} s]"
    except OSError as e:
        rc, out, err = 127, "", f"cannot run {argv[0]}: {e}"
    dt = time.time() - t0
    if rc != 0:
        log(f"    exit {rc} after {dt:.1f} s; stderr tail:\n" + _tail(err, 15))
    return rc, out, err, dt


def _tail(s: str, n: int) -> str:
    lines = (s or "").rstrip().splitlines()
    return "\n".join("      | " + l for l in lines[-n:])


def last_json_line(text: str) -> dict | None:
    """The last stdout line that is a JSON object (the CLI promises its last line is)."""
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                v = json.loads(line)
                if isinstance(v, dict):
                    return v
            except json.JSONDecodeError:
                pass
    return None


def rel_err(a: float, b: float) -> float:
    """|a-b|/|b| (b the reference), inf for non-finite a."""
    if a is None or not math.isfinite(a):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-30)


def load_safetensors_dir(d: Path) -> tuple[dict, dict]:
    """All tensors of an HF directory (single file or shards) -> ({name: tensor}, {name: dtype str})."""
    from safetensors import safe_open
    tensors, dtypes = {}, {}
    files = sorted(Path(d).glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                dtypes[k] = sf.get_slice(k).get_dtype()
                tensors[k] = sf.get_tensor(k)
    return tensors, dtypes


class Table:
    def __init__(self):
        self.rows = []

    def add(self, group, check, value, tol, ok, note=""):
        self.rows.append((group, check, value, tol, bool(ok), note))
        mark = "ok  " if ok else "FAIL"
        log(f"    [{mark}] {check}: {_fmt(value)} (tol {_fmt(tol)}) {note}")

    def failed(self):
        return [r for r in self.rows if not r[4]]

    def print(self, title):
        w0 = max([len("model")] + [len(r[0]) for r in self.rows])
        w1 = max([len("check")] + [len(r[1]) for r in self.rows])
        log("")
        log(title)
        hdr = f"{'model':{w0}s}  {'check':{w1}s}  {'value':>11s}  {'tol':>9s}  result  note"
        log(hdr)
        log("-" * len(hdr))
        for g, c, v, t, ok, note in self.rows:
            log(f"{g:{w0}s}  {c:{w1}s}  {_fmt(v):>11s}  {_fmt(t):>9s}  {'ok' if ok else 'FAIL':6s}  {note}")
        n_fail = len(self.failed())
        log("-" * len(hdr))
        log(f"{len(self.rows) - n_fail} passed, {n_fail} failed")


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v == 0:
            return "0"
        if not math.isfinite(v):
            return str(v)
        return f"{v:.3e}"
    return str(v)


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------

def reference(model_dir, arch, recs, seq_len, device):
    """fp32 loss, trained-token count and gradients ({name: float64 cpu tensor}) of the global mean."""
    import torch
    model = tiny.load_hf_model(model_dir, arch, device=device, attn="eager")
    model.eval()  # no dropout; autograd works the same in eval mode
    model.zero_grad(set_to_none=True)
    n_total = count_trained(recs, seq_len)
    if n_total == 0:
        raise RuntimeError("data has no trained target")
    total = 0.0
    self_check = []
    for rec in recs:
        ce, n = record_ce_sum(model, rec, seq_len, device)
        if ce is None:
            continue
        (ce / n_total).backward()
        total += float(ce.detach().double())
        # Self-check against transformers' own shifted loss for this record (mean over its targets);
        # with output_router_logits in the config transformers would add coef x aux to it: not here.
        with torch.no_grad():
            ids = rec["input_ids"][:seq_len]
            labels = rec.get("labels", rec["input_ids"])[:seq_len]
            kw = {"output_router_logits": False} if getattr(model.config, "output_router_logits", False) else {}
            out = model(input_ids=torch.tensor([ids], device=device),
                        labels=torch.tensor([labels], device=device), **kw)
            self_check.append(rel_err(float(out.loss) * n, float(ce.detach())))
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads[name] = g.detach().double().cpu()
    shapes = {name: list(p.shape) for name, p in model.named_parameters()}
    return total / n_total, n_total, grads, shapes, max(self_check or [0.0])


def aux_by_definition(logits: list, top_k: int, double_softmax: bool = False) -> float:
    """E * sum_e f_e P_e over the concatenated router logits [L*N, E] (float64): f_e = top-k picks of e
    / (L N), P_e = mean softmax probability of e. double_softmax: the same on softmax(probabilities),
    what transformers computes when its router hands probabilities to load_balancing_loss_func."""
    import torch
    z = torch.cat(logits, dim=0).double()
    p = torch.softmax(z, dim=-1)
    if double_softmax:
        p = torch.softmax(p, dim=-1)
    E = z.shape[-1]
    picks = torch.topk(p, top_k, dim=-1).indices
    f = torch.zeros(E, dtype=torch.float64).index_add_(0, picks.reshape(-1).cpu(),
                                                       torch.ones(picks.numel(), dtype=torch.float64))
    f = f / z.shape[0]
    return float(E * (f * p.mean(dim=0).cpu()).sum())


def aux_call(model, x, lab):
    """One forward with labels= and output_router_logits=True; returns (out, router logits per layer as
    float64 [N, E], captured from each router's input and weight by forward pre-hooks)."""
    import torch
    captured = []
    hooks = []
    for _, mod in router_modules(model):
        def pre(m, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            with torch.no_grad():
                captured.append(h.detach().double().reshape(-1, m.weight.shape[1]) @ m.weight.detach().double().t())
        hooks.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        out = model(input_ids=x, labels=lab, output_router_logits=True)
    finally:
        for h in hooks:
            h.remove()
    return out, captured


def reference_aux(model_dir, arch, recs, seq_len, device):
    """Models with the load-balancing loss (output_router_logits): transformers computes it over all
    tokens of one forward call, so the reference is one batch of every record (equal lengths, no
    padding: make_aux_records) with labels=, and its loss is CE mean + router_aux_loss_coef * aux.
    Returns what reference() does; the self-check is the largest of: the CE part against per-record
    sums, transformers' aux against its definition (aux_by_definition on the captured router logits),
    and its total against CE + coef x that aux. Raises SystemExit(3) with the reason on a mismatch."""
    import torch
    model = tiny.load_hf_model(model_dir, arch, device=device, attn="eager")
    model.eval()
    model.zero_grad(set_to_none=True)
    rows = [record_inputs(r, seq_len) for r in recs]
    if len({len(r[0]) for r in rows}) != 1:
        raise RuntimeError("aux-loss data must hold records of one length (make_aux_records)")
    x = torch.tensor([r[0] for r in rows], dtype=torch.long, device=device)
    lab = torch.tensor([list(rec.get("labels", rec["input_ids"])[:seq_len]) for rec in recs], dtype=torch.long,
                       device=device)
    out, logits = aux_call(model, x, lab)
    out.loss.backward()
    n_total = count_trained(recs, seq_len)
    cfg = model.config
    coef = float(cfg.router_aux_loss_coef)
    top_k = int(cfg.num_experts_per_tok)
    n_moe = len(router_modules(model))
    with torch.no_grad():
        ce = sum(float(record_ce_sum(model, rec, seq_len, device)[0] or 0.0) for rec in recs) / n_total
    if out.aux_loss is None or len(logits) != n_moe or n_moe == 0:
        log(f"REFERENCE SELF-CHECK FAILED: aux_loss {out.aux_loss}, {len(logits)} router calls for {n_moe} routers")
        raise SystemExit(3)
    aux_tf = float(out.aux_loss)
    aux_def = aux_by_definition(logits, top_k)
    checks = {
        "CE part vs per-record sums": rel_err(float(out.loss) - coef * aux_tf, ce),
        "transformers aux vs definition": rel_err(aux_tf, aux_def),
        "transformers loss vs CE + coef x aux": rel_err(float(out.loss), ce + coef * aux_def),
    }
    for k, v in checks.items():
        log(f"  aux self-check: {k}: {v:.2e}")
    if checks["transformers aux vs definition"] > 1e-5:
        aux_dbl = aux_by_definition(logits, top_k, double_softmax=True)
        what = f"transformers aux {aux_tf:.8f}, definition {aux_def:.8f}, double softmax {aux_dbl:.8f}"
        if rel_err(aux_tf, aux_dbl) <= 1e-5:
            # transformers issue 45120: a router that returns its softmax as router_logits, softmaxed
            # again by load_balancing_loss_func. Not ours to copy: this model's row fails, the rest run.
            raise RuntimeError(f"{what}: this transformers applies the softmax twice (its router records "
                               "probabilities as router_logits, transformers issue 45120); slideformer "
                               "computes the documented single softmax")
        log(f"REFERENCE SELF-CHECK FAILED: {what}: neither the definition nor a double softmax")
        raise SystemExit(3)
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().cpu()
             for name, p in model.named_parameters()}
    shapes = {name: list(p.shape) for name, p in model.named_parameters()}
    log(f"  reference with the load-balancing loss: CE {ce:.8f} + {coef} x aux {aux_tf:.6f} "
        f"({n_moe} MoE layers, top-{top_k} of {logits[0].shape[-1]})")
    return float(out.loss), n_total, grads, shapes, max(checks.values()), ce


def is_moe_entry(entry) -> bool:
    if entry["arch"] == "Gemma4ForCausalLM":  # Gemma 4 with its MoE block (enable_moe_block)
        return bool(json.loads((Path(entry["path"]) / "config.json").read_text()).get("enable_moe_block"))
    return entry["arch"] in ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM")


def moe_forward_inputs(recs, seq_len, aux: bool):
    """The forward calls whose routing is compared, as lists of rows of token ids: aux models one
    call of all records (reference_aux, hf_lowp_aux), others one call per record with a trained
    target (reference, hf_lowp), each cut to seq_len."""
    rows = [record_inputs(r, seq_len) for r in recs]
    if aux:
        return [[r[0] for r in rows]]
    return [[r[0]] for r in rows if r[2] > 0]


def reference_routing(entry, recs, seq_len, device) -> dict:
    """fp32 routing of the reference's forward calls: {router name: (logits [tokens, E] float64, picked
    [tokens, k])}, tokens in record order (moe_forward_inputs)."""
    import torch
    model = tiny.load_hf_model(entry["path"], entry["arch"], device=device, attn="eager")
    model.eval()
    k = moe_routing.top_k_of(model.config)
    with moe_routing.RouterTap(model, k) as tap, torch.no_grad():
        for rows in moe_forward_inputs(recs, seq_len, bool(entry.get("aux"))):
            model(input_ids=torch.tensor(rows, dtype=torch.long, device=device))
    del model
    return tap.per_layer()


def report_reference_margins(entry, routes: dict, top_k: int, table):
    """(info) row: the fp32 reference's smallest top-k margins (x logit RMS), the tokens nearest a tie
    named by layer and the two experts at the boundary (k-th picked, first not picked): a routing flip
    in a low-precision run moves a token between exactly those two experts' gradients."""
    import torch
    near = []
    for name, (z, _) in routes.items():
        m = moe_routing.topk_margin(z, top_k)
        order = torch.sort(z, dim=-1, descending=True).indices
        for n in range(z.shape[0]):
            near.append((float(m[n]), name.replace("model.", "").replace(".mlp.gate", "").replace(
                ".block_sparse_moe.gate", ""), n, int(order[n, top_k - 1]), int(order[n, top_k])))
    near.sort()
    if not near:
        return
    want = moe_routing.MOE_MIN_MARGIN
    below = sum(1 for t in near if t[0] < want)
    table.add(entry["name"], "(info) fp32 routing: smallest top-k margin", near[0][0], None, True,
              f"x logit rms; {below}/{len(near)} token-layers below {want:g}; nearest ties: " +
              ", ".join(f"{l} tok {n} e{a}|e{b} {m:.3f}" for m, l, n, a, b in near[:8]))


def check_lowp_routing(entry, mode, ref_routes: dict, low_routes: dict, top_k: int, table):
    """Row: PyTorch's own low-precision run routes every token as the fp32 reference does. Should it
    not (data with near-ties), the 2x rule compares gradients that differ by whole tokens moved
    between experts, in torch's run and, on other tokens, in slideformer's: the row fails and names
    the tokens. Also shows the largest router-logit error relative to the token's margin (the
    distance to a flip: below 0.5 no flip is possible)."""
    flips = moe_routing.routing_flips(ref_routes, low_routes)
    n_flip = sum(len(v) for v in flips.values())
    worst = 0.0
    for name in ref_routes.keys() & low_routes.keys():
        zr, zl = ref_routes[name][0], low_routes[name][0]
        s = zr.sort(dim=-1, descending=True).values
        gap = (s[:, top_k - 1] - s[:, top_k]).clamp_min(1e-30) if top_k < zr.shape[1] else None
        if gap is not None:
            worst = max(worst, float(((zl - zr).abs().max(dim=-1).values / gap).max()))
    shown = [f"{name.replace('model.', '').replace('.mlp.gate', '').replace('.block_sparse_moe.gate', '')} "
             f"tok {n} e{','.join(map(str, a))}->e{','.join(map(str, b))}"
             for name, rows in flips.items() for n, a, b in rows][:6]
    table.add(entry["name"], f"torch {mode}: routing = fp32 reference", n_flip, 0, n_flip == 0,
              f"max router-logit error / margin {worst:.3f}" + (f"; flipped: {', '.join(shown)}" if shown else ""))


def to_file_names(grads: dict, file_shapes: dict) -> dict:
    """transformers v5 keeps each MoE layer's experts as fused parameters (mlp.experts.gate_up_proj
    [E, 2I, H] = gate rows then up rows, mlp.experts.down_proj [E, H, I]; Mixtral's block renamed
    mlp) while checkpoints, and slideformer's gradient files, name each expert's matrices
    (mlp.experts.N.gate_proj / up_proj / down_proj, Mixtral block_sparse_moe.experts.N.w1 / w3 / w2).
    Maps tensors keyed by parameter name to the file names (identity for names already there)."""
    import re
    out = {}
    for k, g in grads.items():
        if k in file_shapes:
            out[k] = g
            continue
        m = re.match(r"(model\.layers\.\d+\.)mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)$", k)
        if m is None:
            out[k] = g
            continue
        pre, what = m.groups()
        mixtral = (pre + "block_sparse_moe.gate.weight") in file_shapes
        block = pre + ("block_sparse_moe." if mixtral else "mlp.")
        if what == "gate.weight":
            out[block + "gate.weight"] = g
            continue
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for e in range(g.shape[0]):
            ge = g[e]
            if what == "experts.gate_up_proj":
                want = file_shapes[f"{block}experts.{e}.{names[0]}.weight"]  # [I, H]
                if list(ge.shape) != [2 * want[0], want[1]]:
                    ge = ge.t()  # a transposed fused layout
                out[f"{block}experts.{e}.{names[0]}.weight"] = ge[: want[0]].contiguous()
                out[f"{block}experts.{e}.{names[1]}.weight"] = ge[want[0]:].contiguous()
            else:
                want = file_shapes[f"{block}experts.{e}.{names[2]}.weight"]  # [H, I]
                if list(ge.shape) != list(want):
                    ge = ge.t()
                out[f"{block}experts.{e}.{names[2]}.weight"] = ge.contiguous()
    return out


def check_save_round_trip(entry, a, table: Table, work: Path):
    """A checkpoint written by transformers, loaded by slideformer and saved back unchanged (one
    step at lr 0, no weight decay), holds the same tensors (names, dtypes, shapes, bytes) and loads
    in transformers again."""
    import torch
    from safetensors import safe_open
    name = entry["name"]
    out_dir = work / "saved" / name
    recs_path = entry["data"]
    rc, out, err, dt = run_cli([a.bin, "train", "--model", entry["path"], "--data", recs_path, "--output",
                                str(out_dir), "--steps", "1", "--lr", "0", "--weight-decay", "0", "--seq-len",
                                str(a.seq_len), "--batch-size", "2", "--device", a.device], a.timeout)
    if rc != 0:
        table.add(name, "save round trip", None, None, False, f"train exit {rc}: {_tail(err, 200)}")
        return

    def tensors(d: Path) -> dict:
        res = {}
        for f in sorted(d.glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as sf:
                for k in sf.keys():
                    res[k] = sf.get_tensor(k)
        return res

    src, dst = tensors(Path(entry["path"])), tensors(out_dir)
    diff = sorted(set(src) ^ set(dst))
    bad = [k for k in sorted(set(src) & set(dst))
           if src[k].dtype != dst[k].dtype or src[k].shape != dst[k].shape
           or not torch.equal(src[k].view(torch.uint8) if src[k].dtype == torch.bfloat16 else src[k],
                              dst[k].view(torch.uint8) if dst[k].dtype == torch.bfloat16 else dst[k])]
    table.add(name, "save round trip: same tensors", len(diff) + len(bad), 0, not diff and not bad,
              (f"names differ {diff[:3]} " if diff else "") + (f"bytes/dtype differ {bad[:3]}" if bad else ""))
    try:
        tiny.load_hf_model(out_dir, entry["arch"], device="cpu")
        table.add(name, "save round trip: transformers loads it", 1, 1, True)
    except Exception as e:
        table.add(name, "save round trip: transformers loads it", 0, 1, False, f"{type(e).__name__}: {e}")


# ----------------------------------------------------------------------------------------------
# One model
# ----------------------------------------------------------------------------------------------

def check_model(entry, a, table: Table, work: Path):
    import torch
    from safetensors import safe_open
    name = entry["name"]
    recs = tiny.read_jsonl(entry["data"])
    log(f"\n== {name}: {entry['arch']} {entry['dtype']} {'sharded' if entry['sharded'] else 'single-file'} "
        f"{'tied' if entry['tied'] else 'untied'} heads {entry['num_heads']}/{entry['num_kv_heads']} "
        f"head_dim {entry['head_dim']} rope {entry['rope'].get('rope_type', 'default')}"
        f"{' (legacy config keys)' if entry.get('legacy_rope') else ''}")

    t0 = time.time()
    ref_loss, ref_n, ref_g, ref_shapes, sc = reference(entry["path"], entry["arch"], recs, a.seq_len, a.ref_device)
    log(f"  reference: loss {ref_loss:.8f} over {ref_n} targets ({time.time() - t0:.1f} s), "
        f"self-check vs transformers' labels= loss: {sc:.2e}")
    if sc > 1e-5:
        log(f"REFERENCE SELF-CHECK FAILED for {name}: {sc:.3e} (bug in hf_parity.py)")
        raise SystemExit(3)
    grad_batch = a.batch_size
    ce_loss = ref_loss  # what `eval` reports: cross-entropy only
    if entry.get("aux"):
        ref_loss, ref_n, ref_g, ref_shapes, sc, ce_loss = reference_aux(entry["path"], entry["arch"], recs,
                                                                         a.seq_len, a.ref_device)
        if sc > 1e-5:
            log(f"REFERENCE SELF-CHECK FAILED for {name}: {sc:.3e} (aux reference, bug in hf_parity.py)")
            raise SystemExit(3)
        grad_batch = len(recs)  # one micro-batch: the loss is over one forward call's tokens
    file_shapes = entry.get("file_shapes") or {}
    ref_g = to_file_names(ref_g, file_shapes)
    ref_shapes = {k: list(v.shape) for k, v in ref_g.items()}
    bound = tolerances(entry, a, recs, ref_g, ref_loss, ce_loss, table)

    common = ["--model", entry["path"], "--data", entry["data"], "--seq-len", str(a.seq_len),
              "--device", a.device]

    # eval at batch size B and at 1
    for bs in (a.batch_size, 1):
        rc, out, err, dt = run_cli([a.bin, "eval", *common, "--batch-size", str(bs)], a.timeout)
        res = last_json_line(out) if rc == 0 else None
        suffix = f"(B={bs})"
        if res is None or "loss" not in res:
            table.add(name, f"eval {suffix}", None, None, False,
                      f"exit {rc}, no JSON line with 'loss'" if rc == 0 else f"exit {rc}")
            continue
        try:
            loss = float(res["loss"])
        except (TypeError, ValueError):
            loss = math.nan
        table.add(name, f"eval loss rel {suffix}", rel_err(loss, ce_loss), bound.ce,
                  rel_err(loss, ce_loss) <= bound.ce, f"sf {loss:.7f} ref {ce_loss:.7f}")
        toks = res.get("tokens")
        table.add(name, f"eval tokens {suffix}", toks, ref_n, toks == ref_n, "must equal")
        if expected_engine() is not None:
            table.add(name, f"eval engine {suffix}", res.get("engine"), expected_engine(),
                      res.get("engine") == expected_engine(), "as --cli-args asks")

    # grad
    gpath = work / "grads" / f"{name}.safetensors"
    gpath.parent.mkdir(parents=True, exist_ok=True)
    if gpath.exists():
        gpath.unlink()
    rc, out, err, dt = run_cli([a.bin, "grad", *common, "--batch-size", str(grad_batch),
                                "--output", str(gpath)], a.timeout)
    if rc != 0 or not gpath.exists():
        table.add(name, "grad", None, None, False, f"exit {rc}" + ("" if gpath.exists() else ", no output file"))
        return
    if expected_engine() is not None:
        gres = last_json_line(out) or {}
        table.add(name, "grad engine", gres.get("engine"), expected_engine(),
                  gres.get("engine") == expected_engine(), "as --cli-args asks")
    try:
        with safe_open(str(gpath), framework="pt") as sf:
            meta = sf.metadata() or {}
            keys = list(sf.keys())
            dtypes = {k: sf.get_slice(k).get_dtype() for k in keys}
            got = {k: sf.get_tensor(k) for k in keys}
    except Exception as e:  # malformed file
        table.add(name, "grad file readable", None, None, False, f"{type(e).__name__}: {e}")
        return

    want = set(ref_g)
    missing, extra = sorted(want - set(got)), sorted(set(got) - want)
    table.add(name, "grad names", len(got), len(want), not missing and not extra,
              (f"missing {missing[:4]}{'...' if len(missing) > 4 else ''} " if missing else "") +
              (f"extra {extra[:4]}{'...' if len(extra) > 4 else ''}" if extra else ""))
    bad_dtype = [k for k in got if dtypes[k] != "F32"]
    bad_shape = [k for k in got if k in ref_shapes and list(got[k].shape) != ref_shapes[k]]
    table.add(name, "grad dtype F32 + shapes", len(bad_dtype) + len(bad_shape), 0,
              not bad_dtype and not bad_shape,
              (f"non-F32 {bad_dtype[:3]} " if bad_dtype else "") + (f"shape {bad_shape[:3]}" if bad_shape else ""))
    ml = meta.get("loss")
    try:
        ml = float(ml)
    except (TypeError, ValueError):
        ml = None
    table.add(name, "grad metadata loss rel", rel_err(ml, ref_loss) if ml is not None else None, bound.loss,
              ml is not None and rel_err(ml, ref_loss) <= bound.loss,
              "" if ml is not None else f"metadata {meta}")

    per = grad_errors(got, ref_g, a.device)
    # Worst by margin: the error as a fraction of the tensor's own bound.
    per.sort(key=lambda t: -(t[0] / bound.grad(t[1])) if math.isfinite(t[0]) else -math.inf)
    n_bad = sum(1 for r, k, *_ in per if not r <= bound.grad(k))
    worst = per[0] if per else (math.inf, "-", 0.0, "")
    table.add(name, "grad max rel (per tensor)", worst[0], bound.grad(worst[1]), n_bad == 0 and bool(per),
              f"worst (by margin) {worst[1]}; {n_bad}/{len(per)} tensors over their bound; {bound.how}")
    show = per if (a.verbose or n_bad) else per[:3]
    for r, k, nrm, how in show:
        log(f"      {'OVER ' if not r <= bound.grad(k) else '     '}{r:.3e} (bound {bound.grad(k):.3e})  {k}  "
            f"|g_ref|={nrm:.3e}{'  (' + how + ')' if how else ''}")

    check_save_round_trip(entry, a, table, work)


class Bounds:
    """Tolerances of one model: loss (what grad's metadata reports: CE, plus coef x aux where on), ce
    (eval's cross-entropy), and grad(name) per tensor; `how` says where they come from."""

    def __init__(self, loss, ce, grad_default, per_tensor=None, how=""):
        self.loss, self.ce, self._g, self._per, self.how = loss, ce, grad_default, per_tensor or {}, how

    def grad(self, name):
        return self._per.get(name, self._g)


def tolerances(entry, a, recs, ref_g, ref_loss, ce_loss, table) -> Bounds:
    """cpu, or cuda with a fixed tolerance asked for: TOL. cuda otherwise: LOWP_FACTOR x PyTorch's own
    error in bf16 (all-bf16 and autocast, the larger) against the same fp32 reference, per tensor, at
    least the floors. The measurements are shown as (info) rows."""
    tol = TOL[a.device]
    if a.device != "cuda" or a.fixed_tol:
        return Bounds(tol["loss"], tol["loss"], tol["grad"], how=f"fixed tolerances {tol}")
    name = entry["name"]
    file_shapes = entry.get("file_shapes") or {}
    worst_g: dict = {}
    loss_err = ce_err = 0.0
    ref_routes = None
    if is_moe_entry(entry):
        ref_routes = reference_routing(entry, recs, a.seq_len, a.ref_device)
        top_k = moe_routing.top_k_of(json.loads((Path(entry["path"]) / "config.json").read_text()))
        report_reference_margins(entry, ref_routes, top_k, table)
    for mode in ("bf16", "autocast"):
        if entry.get("aux"):
            bl_loss, bl_ce, bl_g, routes = hf_lowp_aux(entry, recs, a.seq_len, mode)
        else:
            bl_loss, bl_g, routes = hf_lowp(entry, recs, a.seq_len, mode)
            bl_ce = bl_loss
        if ref_routes is not None:
            check_lowp_routing(entry, mode, ref_routes, routes, top_k, table)
        bper = grad_errors(to_file_names(bl_g, file_shapes), ref_g, "cuda")
        for r, k, *_ in bper:
            worst_g[k] = max(worst_g.get(k, 0.0), r)
        loss_err = max(loss_err, rel_err(bl_loss, ref_loss))
        ce_err = max(ce_err, rel_err(bl_ce, ce_loss))
        table.add(name, f"(info) transformers {mode}: grad max rel", bper[0][0], None, True,
                  f"loss rel {rel_err(bl_loss, ref_loss):.2e}; worst {bper[0][1]}")
    missing = sorted(set(ref_g) - set(worst_g))
    if missing:  # every tensor needs its own measurement: a name torch did not give is a harness bug
        raise RuntimeError(f"low-precision baseline lacks gradients of {missing[:3]}")
    per = {k: max(LOWP_FACTOR * v, LOWP_GRAD_FLOOR) for k, v in worst_g.items()}
    return Bounds(max(LOWP_FACTOR * loss_err, LOWP_LOSS_FLOOR), max(LOWP_FACTOR * ce_err, LOWP_LOSS_FLOOR),
                  LOWP_GRAD_FLOOR, per,
                  how=f"bound {LOWP_FACTOR:g} x torch bf16/autocast error, floor {LOWP_GRAD_FLOOR:g}")


def grad_errors(got: dict, ref_g: dict, device: str) -> list[tuple[float, str, float, str]]:
    """[(||g - g_ref|| / scale, name, ||g_ref||, how)], worst first, over the names both have.

    scale = ||g_ref||, but at least GRAD_NORM_FLOOR x the median tensor norm (near-zero gradients).
    On cuda, k_proj.bias is measured on the scale of the same layer's q_proj.bias gradient: its own
    gradient nearly vanishes (a bias on k shifts a query's scores by a constant, which softmax ignores,
    except through RoPE's rotation, slow in most dimensions), so bf16 round-off dominates its own norm.
    """
    norms = {k: float(v.norm()) for k, v in ref_g.items()}
    med = sorted(norms.values())[len(norms) // 2] if norms else 1.0
    floor = GRAD_NORM_FLOOR * med
    per = []
    for k in sorted(set(got) & set(ref_g)):
        if list(got[k].shape) != list(ref_g[k].shape):
            continue
        d = float((got[k].double() - ref_g[k]).norm())
        den, how = norms[k], ""
        if device == "cuda" and k.endswith("k_proj.bias"):
            q = k[: -len("k_proj.bias")] + "q_proj.bias"
            if q in norms and norms[q] > den:
                den, how = norms[q], "on q_proj.bias scale"
        if den < floor:
            den, how = floor, "compared to floor"
        r = d / den if math.isfinite(d) else math.inf
        per.append((r, k, norms[k], how))
    per.sort(key=lambda t: (-t[0] if math.isfinite(t[0]) else -math.inf, t[1]))
    return per


def hf_lowp(entry, recs, seq_len, mode):
    """transformers on the GPU in low precision: loss, fp32 gradients (mode 'bf16' or 'autocast') and
    the MoE routing of its forward calls (RouterTap.per_layer(); {} for dense models)."""
    import torch
    model = tiny.load_hf_model(entry["path"], entry["arch"], device="cuda", attn="sdpa")
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    model.eval()
    n_total = count_trained(recs, seq_len)
    total = 0.0
    with moe_routing.RouterTap(model, moe_routing.top_k_of(model.config) if is_moe_entry(entry) else 1) as tap:
        for rec in recs:
            ce, n = batch_ce_sum(model, [rec], seq_len, "cuda", autocast_bf16=(mode == "autocast"))
            if ce is None:
                continue
            (ce / n_total).backward()
            total += float(ce.detach())
    g = {k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().cpu()
         for k, p in model.named_parameters()}
    del model
    torch.cuda.empty_cache()
    return total / n_total, g, tap.per_layer()


def hf_lowp_aux(entry, recs, seq_len, mode):
    """hf_lowp for models with the load-balancing loss: the reference's one labels= call (all records
    one batch, output_router_logits) in low precision. Returns (loss, its CE part, fp32 gradients,
    routing as RouterTap.per_layer())."""
    import torch
    model = tiny.load_hf_model(entry["path"], entry["arch"], device="cuda", attn="sdpa")
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    model.eval()
    rows = [record_inputs(r, seq_len) for r in recs]
    x = torch.tensor([r[0] for r in rows], dtype=torch.long, device="cuda")
    lab = torch.tensor([list(rec.get("labels", rec["input_ids"])[:seq_len]) for rec in recs], dtype=torch.long,
                       device="cuda")
    with moe_routing.RouterTap(model, int(model.config.num_experts_per_tok)) as tap:
        if mode == "autocast":
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                out = model(input_ids=x, labels=lab, output_router_logits=True)
        else:
            out = model(input_ids=x, labels=lab, output_router_logits=True)
    out.loss.backward()
    loss = float(out.loss.detach().float())
    ce = loss - float(model.config.router_aux_loss_coef) * float(out.aux_loss.detach().float())
    g = {k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().cpu()
         for k, p in model.named_parameters()}
    del model
    torch.cuda.empty_cache()
    return loss, ce, g, tap.per_layer()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="path of the slideformer binary")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="passed to slideformer; picks tolerances")
    ap.add_argument("--ref-device", choices=["cpu", "cuda"], default="cpu",
                    help="where the fp32 reference runs (default cpu: exact and quick for tiny models)")
    ap.add_argument("--work", default=None, help="work folder (default: a new temporary folder)")
    ap.add_argument("--models", default="", help="comma-separated subset of model names")
    ap.add_argument("--seq-len", type=int, default=tiny.PARITY_SEQ_LEN)
    ap.add_argument("--batch-size", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per CLI call")
    ap.add_argument("--loss-tol", type=float, default=None, help="override the loss tolerance")
    ap.add_argument("--grad-tol", type=float, default=None, help="override the gradient tolerance")
    ap.add_argument("--verbose", action="store_true", help="print every tensor's gradient error")
    ap.add_argument("--cli-args", default="", help="extra slideformer options, e.g. '--offload --slots 2'")
    ap.add_argument("--init-range", type=float, default=None,
                    help="initializer_range of the tiny models (default: 0.1 with --device cpu, 0.02 with "
                         "--device cuda, where at 0.1 transformers' own bf16 gradients miss 3e-2)")
    ap.add_argument("--route-margin", type=float, default=moe_routing.MOE_MIN_MARGIN,
                    help="MoE data: every token's top-k router-logit margin at least this x the logit RMS "
                         "in the fp32 model (default %(default)s); 0 keeps the random tokens, near-ties "
                         "included (to see what near-ties do)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="cuda: do not measure transformers in bf16; use the fixed tolerances (TOL) instead")
    a = ap.parse_args(argv)
    CLI_EXTRA[:] = shlex.split(a.cli_args)

    a.bin = str(Path(a.bin).resolve())
    if a.init_range is None:
        a.init_range = CUDA_INIT_RANGE if a.device == "cuda" else None
    if not os.access(a.bin, os.X_OK):
        log(f"--bin {a.bin}: not an executable file")
        return 2
    if a.loss_tol is not None:
        TOL[a.device]["loss"] = a.loss_tol
    if a.grad_tol is not None:
        TOL[a.device]["grad"] = a.grad_tol
    # cuda: the low-precision rule unless a fixed tolerance is asked for (both loss and grad then fixed).
    a.fixed_tol = a.no_baseline or a.loss_tol is not None or a.grad_tol is not None
    setup_torch(a.ref_device)
    import torch
    import transformers
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {a.device}, "
        f"reference on {a.ref_device} fp32 (TF32 off), seq-len {a.seq_len}, batch {a.batch_size}, "
        f"tolerances {TOL[a.device] if a.device == 'cpu' or a.fixed_tol else f'{LOWP_FACTOR:g} x torch bf16 error (floors grad {LOWP_GRAD_FLOOR:g}, loss {LOWP_LOSS_FLOOR:g})'}, "
        f"init range {a.init_range or 0.1}")
    if a.device == "cuda" and torch.cuda.is_available():
        log(f"GPU: {torch.cuda.get_device_name(0)}")

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="sf_parity_"))
    work.mkdir(parents=True, exist_ok=True)
    only = [x for x in a.models.split(",") if x] or None
    if only:
        unknown = [x for x in only if x not in tiny.MODELS]
        if unknown:
            log(f"unknown model(s) {unknown}; known: {list(tiny.MODELS)}")
            return 2
    log(f"building tiny models in {work}")
    manifest = tiny.build_all(work, seed=a.seed, only=only, init_range=a.init_range,
                              route_margin=a.route_margin or None)

    table = Table()
    for name, entry in manifest["models"].items():
        try:
            check_model(entry, a, table, work)
        except SystemExit:
            raise
        except Exception as e:
            import traceback
            traceback.print_exc()
            table.add(name, "harness", None, None, False, f"{type(e).__name__}: {e}")

    table.print(f"hf_parity --device {a.device}  (slideformer vs transformers fp32; work {work})")
    return 1 if table.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
