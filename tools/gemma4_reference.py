#!/usr/bin/env python3
"""Gemma 4's forward math as docs/GEMMA4.md writes it, checked against transformers.

Builds tiny random Gemma4ForCausalLM models with the installed transformers (>= 5.5; the GPU
machine has 5.17), runs an independent torch implementation of docs/GEMMA4.md section 2 on the same
weights (read by their checkpoint names) and compares the loss, the logits and every parameter's
gradient in fp32. --names prints each model's saved config.json and tensor names/shapes (what
model/layout.cpp matches). --binary PATH also checks that slideformer loads each saved model (`plan`
exits 0; a variant in REFUSED_KEY must be refused naming that config key, exit 2, one line).

Exit 0 when every variant agrees within --tol (relative to the tensor's max), 1 otherwise.
    python3 tools/gemma4_reference.py [--names] [--binary build/slideformer] [--only dense]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F


def layer_types(n, globals_at):
    return ["full_attention" if i in globals_at else "sliding_attention" for i in range(n)]


BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, num_global_key_value_heads=1,
            head_dim=16, global_head_dim=32, attention_k_eq_v=True, hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=96, num_kv_shared_layers=0, sliding_window=5,
            final_logit_softcapping=2.0, max_position_embeddings=64, rms_norm_eps=1e-6,
            tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
            layer_types=layer_types(6, {2, 5}), pad_token_id=0, bos_token_id=2, eos_token_id=1,
            initializer_range=0.1,
            rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})

VARIANTS = {
    # The 31B's features: k=v on global layers, wider global heads, fewer global KV heads, soft-cap.
    "dense": dict(),
    "dense_nokeqv": dict(attention_k_eq_v=False, final_logit_softcapping=None),
    # K/V shared by the last two layers (one local, one global) with double-wide MLPs, no PLE.
    "kvshared": dict(num_kv_shared_layers=2, use_double_wide_mlp=True, layer_types=layer_types(6, {1, 5})),
    # The E-models' features: per-layer input embeddings, K/V shared by the last two layers
    # (one local, one global), double-wide MLPs there.
    "ple_kvshared": dict(hidden_size_per_layer_input=8, num_kv_shared_layers=2, use_double_wide_mlp=True,
                         layer_types=layer_types(6, {1, 5})),
    # The 26B-A4B's MoE block beside the dense MLP.
    "moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24),
    # Everything at once: the MoE block with per-layer inputs and K/V shared by the last two layers.
    "moe_ple_kvshared": dict(enable_moe_block=True, num_experts=5, top_k_experts=2, moe_intermediate_size=16,
                             hidden_size_per_layer_input=8, num_kv_shared_layers=2, use_double_wide_mlp=True,
                             layer_types=layer_types(6, {1, 5})),
}


# What slideformer refuses in each variant it does not train yet (the config key it names): none
# since session 12 (the MoE block trains).
REFUSED_KEY: dict[str, str] = {}


def rms(x, w, eps):
    """Gemma4RMSNorm as docs/GEMMA4.md: fp32, times w (not 1 + w), one rounding; w None: no weight."""
    xf = x.float()
    n = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if w is not None:
        n = n * w.float()
    return n.to(x.dtype)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def rope_tables(inv, T, dtype):
    pos = torch.arange(T, dtype=torch.float32)
    freqs = pos[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def inv_default(theta, d):
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))


def inv_proportional(theta, d, fraction, factor=1.0):
    angles = int(fraction * d // 2)
    inv = torch.zeros(d // 2)
    inv[:angles] = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64).float() / d))
    return inv / factor


def rope(x, cos, sin):  # x [B, T, heads, d]; half-split rotate_half
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos[None, :, None, :] + rot * sin[None, :, None, :]


def attention(q, k, v, window):  # q [B, T, nq, d], k/v [B, T, nkv, d]; scale 1
    B, T, nq, d = q.shape
    rep = nq // k.shape[2]
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    ok = j <= i
    if window:
        ok = ok & (i - j < window)
    s = s.masked_fill(~ok, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(B, T, nq * d)


def reference_loss(cfg, P, ids):
    """docs/GEMMA4.md section 2 on the parameters P (name -> tensor), mean next-token CE."""
    pre = "model."
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    eps = cfg["rms_norm_eps"]
    types = cfg["layer_types"]
    B, T = ids.shape
    dt = P[pre + "embed_tokens.weight"].dtype
    hd, ghd = cfg["head_dim"], cfg["global_head_dim"]
    rp = cfg["rope_parameters"]
    g = rp["full_attention"]
    inv_g = inv_proportional(g["rope_theta"], ghd, g.get("partial_rotary_factor", 1.0), g.get("factor", 1.0))
    tabs = {"sliding_attention": rope_tables(inv_default(rp["sliding_attention"]["rope_theta"], hd), T, dt),
            "full_attention": rope_tables(inv_g, T, dt)}
    x = P[pre + "embed_tokens.weight"][ids] * torch.tensor(H ** 0.5, dtype=dt)
    Pd = cfg.get("hidden_size_per_layer_input") or 0
    if Pd:
        tok = (P[pre + "embed_tokens_per_layer.weight"][ids] * torch.tensor(Pd ** 0.5, dtype=dt)).reshape(B, T, L, Pd)
        ctx = (x @ P[pre + "per_layer_model_projection.weight"].T) * H ** -0.5
        ctx = rms(ctx.reshape(B, T, L, Pd), P[pre + "per_layer_projection_norm.weight"], eps)
        pli = (ctx + tok) * 2 ** -0.5
    n_shared = cfg.get("num_kv_shared_layers") or 0
    first_shared = L - n_shared
    kv_of = {}  # layer type -> (k, v) of the last non-shared layer of that type
    for l in range(L):
        p = f"{pre}layers.{l}."
        glob = types[l] == "full_attention"
        d = ghd if glob else hd
        h = rms(x, P[p + "input_layernorm.weight"], eps)
        q = (h @ P[p + "self_attn.q_proj.weight"].T).reshape(B, T, -1, d)
        cos, sin = tabs[types[l]]
        q = rope(rms(q, P[p + "self_attn.q_norm.weight"], eps), cos, sin)
        if l >= first_shared:
            k, v = kv_of[types[l]]
        else:
            kr = (h @ P[p + "self_attn.k_proj.weight"].T).reshape(B, T, -1, d)
            vr = kr if (cfg["attention_k_eq_v"] and glob) else (h @ P[p + "self_attn.v_proj.weight"].T).reshape(B, T, -1, d)
            k = rope(rms(kr, P[p + "self_attn.k_norm.weight"], eps), cos, sin)
            v = rms(vr, None, eps)
            kv_of[types[l]] = (k, v)
        a = attention(q, k, v, None if glob else cfg["sliding_window"])
        x2 = x + rms(a @ P[p + "self_attn.o_proj.weight"].T, P[p + "post_attention_layernorm.weight"], eps)
        hf = rms(x2, P[p + "pre_feedforward_layernorm.weight"], eps)
        m = (gelu_tanh(hf @ P[p + "mlp.gate_proj.weight"].T) * (hf @ P[p + "mlp.up_proj.weight"].T)) @ \
            P[p + "mlp.down_proj.weight"].T
        if cfg.get("enable_moe_block"):
            m1 = rms(m, P[p + "post_feedforward_layernorm_1.weight"], eps)
            r = rms(x2, None, eps) * P[p + "router.scale"] * H ** -0.5
            probs = torch.softmax(r @ P[p + "router.proj.weight"].T, dim=-1)
            w, idx = torch.topk(probs, cfg["top_k_experts"], dim=-1)
            w = w / w.sum(-1, keepdim=True)
            w = w * P[p + "router.per_expert_scale"][idx]
            xe = rms(x2, P[p + "pre_feedforward_layernorm_2.weight"], eps)
            gu, dn = P[p + "experts.gate_up_proj"], P[p + "experts.down_proj"]
            Ie = cfg["moe_intermediate_size"]
            m2 = torch.zeros_like(xe)
            for j in range(cfg["top_k_experts"]):
                for e in range(cfg["num_experts"]):
                    sel = (idx[..., j] == e)
                    if not sel.any():
                        continue
                    xs = xe[sel]
                    gate, up = (xs @ gu[e].T).split(Ie, dim=-1)
                    ys = (gelu_tanh(gate) * up) @ dn[e].T
                    m2 = m2.index_put(sel.nonzero(as_tuple=True), m2[sel] + ys * w[..., j][sel][:, None])
            m = m1 + rms(m2, P[p + "post_feedforward_layernorm_2.weight"], eps)
        y = x2 + rms(m, P[p + "post_feedforward_layernorm.weight"], eps)
        if Pd:
            t = gelu_tanh(y @ P[p + "per_layer_input_gate.weight"].T) * pli[:, :, l, :]
            y = y + rms(t @ P[p + "per_layer_projection.weight"].T, P[p + "post_per_layer_input_norm.weight"], eps)
        x = y * P[p + "layer_scalar"]
    x = rms(x, P[pre + "norm.weight"], eps)
    head = P.get("lm_head.weight", P[pre + "embed_tokens.weight"])
    z = x @ head.T
    c = cfg.get("final_logit_softcapping")
    if c:
        z = c * torch.tanh(z / c)
    return F.cross_entropy(z[:, :-1].reshape(-1, z.shape[-1]).float(), ids[:, 1:].reshape(-1)), z


def build(name, kw, out: Path):
    import transformers
    cfg = transformers.Gemma4TextConfig(**kw)
    cfg._attn_implementation = "eager"  # the reference's exact softmax; sdpa would agree within fp32 too
    torch.manual_seed(7)
    model = transformers.Gemma4ForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for n, t in list(model.named_parameters()) + list(model.named_buffers()):
            # Norms and scales around 1 (they start at exactly 1), so each one's gradient shows.
            if n.endswith("norm.weight") or n.endswith("layer_scalar") or n.endswith("router.scale") or \
                    n.endswith("per_expert_scale"):
                t.copy_(1.0 + 0.3 * torch.randn(t.shape, generator=gen))
    model.save_pretrained(out / name, safe_serialization=True)
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", action="store_true", help="print each saved config.json and tensor names/shapes")
    ap.add_argument("--binary", help="slideformer binary: check it reads each saved config")
    ap.add_argument("--only", nargs="*", help="variants to run (default all): " + ", ".join(VARIANTS))
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args(argv)
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for name in a.only or VARIANTS:
            kw = dict(BASE)
            kw.update(VARIANTS[name])
            model = build(name, kw, out)
            saved = json.loads((out / name / "config.json").read_text())
            if a.names:
                print(f"== {name} config.json\n{json.dumps(saved, indent=1, sort_keys=True)}")
                from safetensors import safe_open
                with safe_open(str(out / name / "model.safetensors"), "pt") as f:
                    for k in sorted(f.keys()):
                        print(f"  {k} {list(f.get_slice(k).get_shape())}")
            gen = torch.Generator().manual_seed(5)
            ids = torch.randint(3, kw["vocab_size"], (2, 12), generator=gen)
            out_hf = model(input_ids=ids, labels=ids)
            params = dict(model.named_parameters())
            buffers = {n: b for n, b in model.named_buffers() if n.endswith("layer_scalar")}
            g_hf = torch.autograd.grad(out_hf.loss, list(params.values()))
            P = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
            P.update({n: b.detach().clone() for n, b in buffers.items()})
            loss, logits = reference_loss(kw, P, ids)
            g_ref = torch.autograd.grad(loss, [P[n] for n in params])
            worst, worst_name = 0.0, ""
            for n, gh, gr in zip(params, g_hf, g_ref):
                err = (gh - gr).abs().max().item() / max(gh.abs().max().item(), 1e-12)
                if err > worst:
                    worst, worst_name = err, n
            lerr = abs(out_hf.loss.item() - loss.item()) / abs(out_hf.loss.item())
            zerr = (out_hf.logits - logits).abs().max().item() / out_hf.logits.abs().max().item()
            good = lerr <= a.tol and zerr <= a.tol and worst <= a.tol
            ok = ok and good
            print(f"{name}: loss {out_hf.loss.item():.6f} vs {loss.item():.6f} (rel {lerr:.2e}), logits rel "
                  f"{zerr:.2e}, worst gradient rel {worst:.2e} ({worst_name}), {len(params)} tensors: "
                  f"{'ok' if good else 'DIFFERENT'}", flush=True)
            if a.binary:
                # Dense variants load (plan exits 0); the others are refused, exit 2 naming the key.
                r = subprocess.run([a.binary, "plan", "--model", str(out / name), "--seq-len", "16",
                                    "--batch-size", "1"], capture_output=True, text=True)
                msg = (r.stderr + r.stdout).strip().splitlines()
                key = REFUSED_KEY.get(name)
                if key is None:
                    read = r.returncode == 0
                else:
                    read = r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and key in r.stderr
                ok = ok and read
                print(f"  slideformer: exit {r.returncode}: {msg[-1] if msg else ''} "
                      f"({'as expected' if read else 'UNEXPECTED'}: "
                      f"{'loads' if key is None else 'refused naming ' + key})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
