#!/usr/bin/env python3
"""PyTorch eager baseline for slideformer's in-memory GPU training step.

    python3 bench/torch_train_baseline.py                       # Llama-3-style 1B, batch 8 x 2048
    python3 bench/torch_train_baseline.py --layers 2 --steps 3  # shrunk smoke run
    python3 bench/torch_train_baseline.py --preset olmoe-1b-7b  # mixture of experts, grouped_mm experts
    python3 bench/torch_train_baseline.py --preset gemma3-4b    # Gemma 3 4B text shape (head dim 256)

The model is transformers' LlamaForCausalLM with the Llama-3.2-1B shape (hidden 2048, intermediate 8192,
16 layers, 32 heads, 8 KV heads, head_dim 64, vocab 128256, tied embeddings, rope_theta 500000), random
init (std 0.02), fp32 master weights, bf16 autocast, gradient checkpointing per decoder layer
(use_reentrant=False), SDPA attention, torch.optim.AdamW(fused=True), loss = transformers' causal LM
loss on random tokens (labels = input_ids). This is "PyTorch eager with the HF model" as the CUDA
backend issue defines it: slideformer's in-memory step must reach >= 1.2x these tokens/s.

Warm-up steps are run and discarded, then --steps steps are timed between torch.cuda.synchronize()
calls (CUDA events give the per-step median). Peak memory is torch.cuda.max_memory_allocated over
the timed steps. Progress goes to stderr; the result is ONE JSON line on stdout (the last line).

Mixture-of-experts presets (olmoe-1b-7b, qwen3-30b-a3b: the shapes of slideformer's bench presets
of those names, train/presets.cpp) build transformers' OlmoeForCausalLM / Qwen3MoeForCausalLM with
--experts-impl (default grouped_mm: tokens sorted by expert, torch._grouped_mm, transformers 5's
fastest experts backend for training-size inputs; eager loops over experts, batched_mm duplicates
expert weights per token). The implementation in effect is reported ("experts_implementation"), and
the model FLOPs counted as slideformer counts them: 6 x active parameters per token (router +
top_k experts per MoE layer, embedding lookup excluded) + causal attention.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# transformers config keys of the mixture-of-experts presets (the values of train/presets.cpp).
MOE_PRESETS = {
    "olmoe-1b-7b": ("olmoe", dict(
        vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, num_experts=64, num_experts_per_tok=8, norm_topk_prob=False,
        output_router_logits=False, router_aux_loss_coef=0.01, rms_norm_eps=1e-5, max_position_embeddings=4096,
        hidden_act="silu", tie_word_embeddings=False, clip_qkv=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "qwen3-30b-a3b": ("qwen3_moe", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        output_router_logits=False, router_aux_loss_coef=0.001, rms_norm_eps=1e-6,
        max_position_embeddings=40960, hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
        use_sliding_window=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}


def build_moe_model(a, torch, transformers):
    """A MoE preset's model with the experts backend a.experts_impl; returns (model, backend in effect)."""
    model_type, kw = MOE_PRESETS[a.preset]
    kw = dict(kw, use_cache=False, initializer_range=0.02)
    if a.layers_given:
        kw["num_hidden_layers"] = a.layers
    cfg = transformers.AutoConfig.for_model(model_type, **kw)
    with torch.device("cuda"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, attn_implementation=a.attn, dtype=torch.float32, experts_implementation=a.experts_impl)
        except TypeError:  # an older 5.x without the keyword: set it afterwards
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=a.attn,
                                                                  dtype=torch.float32)
            if hasattr(model, "set_experts_implementation"):
                model.set_experts_implementation(a.experts_impl)
    model = model.float().cuda()
    model.config.use_cache = False
    used = getattr(model.config, "_experts_implementation", None)
    if not a.no_grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, used


# google/gemma-3-4b-pt's text config, as slideformer's bench preset gemma3-4b (train/presets.cpp).
GEMMA3_4B = dict(
    vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6, sliding_window=1024, max_position_embeddings=131072, tie_word_embeddings=True,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)])


def build_gemma3_model(a, torch, transformers):
    """Gemma3ForCausalLM of the 4B text shape: the legacy rope keys where the version takes them, else
    the per-layer-type rope_parameters of transformers 5."""
    kw = dict(GEMMA3_4B, use_cache=False, initializer_range=0.02, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    if a.layers_given:
        kw["num_hidden_layers"] = a.layers
        kw["layer_types"] = kw["layer_types"][:a.layers]
    try:
        cfg = transformers.Gemma3TextConfig(rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                            rope_scaling={"rope_type": "linear", "factor": 8.0}, **kw)
    except (TypeError, ValueError, KeyError):
        cfg = transformers.Gemma3TextConfig(rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, **kw)
    with torch.device("cuda"):
        model = transformers.Gemma3ForCausalLM._from_config(cfg, attn_implementation=a.attn, dtype=torch.float32)
    model = model.float().cuda()
    model.config.use_cache = False
    if not a.no_grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def moe_active_flops_per_token(cfg, T: int) -> float:
    """6 x active parameters (attention, norms, router, top_k experts; LM head; not the embedding
    lookup) + causal attention 6 * L * T * q_dim (fwd 2 T q_dim x2 halved by causality, x3 for bwd)."""
    H = cfg.hidden_size
    hd = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    Q, KV = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    E = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    k = cfg.num_experts_per_tok
    Ie = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    per_layer = 2 * H * Q + 2 * H * KV + E * H + k * 3 * H * Ie
    active = cfg.num_hidden_layers * per_layer + cfg.vocab_size * H
    return 6.0 * active + 6.0 * cfg.num_hidden_layers * T * Q


def build_model(a, torch, transformers):
    cfg_kw = dict(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        max_position_embeddings=max(8192, a.seq), rms_norm_eps=1e-5, initializer_range=0.02,
        tie_word_embeddings=not a.untied, use_cache=False, bos_token_id=1, eos_token_id=2,
    )
    rope = {"rope_type": "default", "rope_theta": a.rope_theta}
    try:
        cfg = transformers.LlamaConfig(rope_parameters=rope, **cfg_kw)
    except TypeError:  # transformers 4.x
        cfg = transformers.LlamaConfig(rope_theta=a.rope_theta, **cfg_kw)
    with torch.device("cuda"):
        try:
            model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=a.attn, dtype=torch.float32)
        except TypeError:
            model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=a.attn,
                                                               torch_dtype=torch.float32)
    model = model.float().cuda()
    model.config.use_cache = False
    if not a.no_grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rope-theta", type=float, default=500000.0)
    ap.add_argument("--untied", action="store_true", help="untied LM head (default: tied, as Llama-3.2-1B)")
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation (default sdpa)")
    ap.add_argument("--no-grad-ckpt", action="store_true", help="disable gradient checkpointing")
    ap.add_argument("--no-fused", action="store_true", help="AdamW without fused=True")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", choices=["1b", "3b", "8b", "gemma3-4b", *MOE_PRESETS],
                    help="Llama-3.2-1B / 3.2-3B / 3.1-8B shapes, or a mixture-of-experts shape")
    ap.add_argument("--experts-impl", default="grouped_mm", choices=["grouped_mm", "eager", "batched_mm"],
                    help="MoE presets: transformers' experts backend (default grouped_mm)")
    ap.add_argument("--clip", type=float, default=0.0, help="clip_grad_norm_ to this (0: off)")
    ap.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    a = ap.parse_args(argv)
    a.layers_given = any(x == "--layers" or x.startswith("--layers=") for x in (argv if argv is not None else sys.argv[1:]))
    moe = a.preset in MOE_PRESETS
    shapes = {"1b": (16, 2048, 8192, 32, 8, False), "3b": (28, 3072, 8192, 24, 8, False),
              "8b": (32, 4096, 14336, 32, 8, True)}
    if a.preset and not moe and a.preset != "gemma3-4b":
        a.layers, a.hidden, a.intermediate, a.heads, a.kv_heads, a.untied = shapes[a.preset]

    import torch
    import transformers
    if not torch.cuda.is_available():
        log("torch sees no GPU")
        return 2
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True  # only matters for fp32 matmuls outside autocast
    dev_name = torch.cuda.get_device_name(0)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {dev_name}")

    t0 = time.time()
    experts_used = None
    if moe:
        model, experts_used = build_moe_model(a, torch, transformers)
        a.layers, a.hidden, a.vocab = model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size
        a.untied = not model.config.tie_word_embeddings
        log(f"experts implementation: asked {a.experts_impl}, in effect {experts_used}")
    elif a.preset == "gemma3-4b":
        model = build_gemma3_model(a, torch, transformers)
        a.layers, a.hidden, a.vocab = model.config.num_hidden_layers, model.config.hidden_size, model.config.vocab_size
        a.untied = False
    else:
        model = build_model(a, torch, transformers)
    if a.compile:
        for layer in model.model.layers:
            layer.compile()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e9:.3f} B parameters, {a.layers} layers, built in {time.time() - t0:.1f} s")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=not a.no_fused)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda", generator=gen) for _ in range(4)]

    losses = []

    def step(i):
        x = batches[i % len(batches)]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        out.loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    for i in range(a.warmup):
        t1 = time.time()
        l = step(i)
        torch.cuda.synchronize()
        log(f"warm-up {i + 1}/{a.warmup}: loss {float(l):.4f} {time.time() - t1:.3f} s")

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.steps)]
    t0 = time.perf_counter()
    for i in range(a.steps):
        events[i][0].record()
        losses.append(step(a.warmup + i))
        events[i][1].record()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    step_ms = [s.elapsed_time(e) for s, e in events]
    losses = [float(l) for l in losses]
    peak = torch.cuda.max_memory_allocated()
    tokens = a.batch * a.seq * a.steps
    res = {
        "bench": "torch_eager_train_step",
        "model": a.preset if moe or a.preset == "gemma3-4b" else ("llama3-1b-like" if (a.layers, a.hidden) == (16, 2048) else "llama-custom"),
        "experts_implementation": experts_used,
        "params": n_params, "layers": a.layers, "hidden": a.hidden, "vocab": a.vocab,
        "tied": not a.untied, "batch": a.batch, "seq": a.seq, "steps": a.steps, "warmup": a.warmup,
        "grad_ckpt": not a.no_grad_ckpt, "attn": a.attn, "fused_adamw": not a.no_fused,
        "clip": a.clip, "compiled_layers": a.compile, "preset": a.preset,
        "autocast": "bf16", "master_weights": "fp32",
        "tokens_per_s": tokens / elapsed,
        "step_ms_mean": 1000 * elapsed / a.steps,
        "step_ms_median": statistics.median(step_ms),
        "peak_mem_gib": peak / 2**30,
        "loss_first": losses[0], "loss_last": losses[-1],
        "gpu": dev_name, "torch": torch.__version__, "transformers": transformers.__version__,
    }
    if moe:
        fpt = moe_active_flops_per_token(model.config, a.seq)
        res["model_tflops_per_second"] = fpt * tokens / elapsed * 1e-12
        res["mfu_h100_h200_dense_bf16"] = res["model_tflops_per_second"] / 989.0
    if not all(math.isfinite(l) for l in losses):
        log("non-finite loss")
        print(json.dumps(res), flush=True)
        return 1
    log(f"{res['tokens_per_s']:.0f} tok/s, {res['step_ms_median']:.1f} ms/step (median), "
        f"peak {res['peak_mem_gib']:.2f} GiB")
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
