#!/usr/bin/env python3
"""Builds tiny random Hugging Face models and ragged, partly masked JSONL data for parity checks.

    python3 tools/make_tiny_models.py --out DIR [--only NAME,...]

Writes, under DIR:
    models/<name>/            HF checkpoint directory (save_pretrained), fp32 or bf16, single file or sharded
    data/<name>.jsonl         parity data for that model (its own vocab), see make_parity_records()
    manifest.json             one entry per model: arch, dtype, sharded, tied, vocab, parameter names, ...

The models cover the architectures slideformer supports (Llama, Mistral, Qwen2, Qwen3, Gemma 3 text,
dense Gemma 4 text, Qwen3-MoE, Mixtral, OLMoE) and the
features that differ between them: GQA / MQA / MHA, tied and untied embeddings, `llama3` RoPE
scaling, Llama `attention_bias=True`, Qwen2 q/k/v biases, Qwen3 per-head q_norm / k_norm with
head_dim != hidden / heads, the mixture-of-experts families (Qwen3-MoE with a dense layer, Mixtral,
OLMoE with its whole-projection q/k norm; renormalised top-k or not; load-balancing loss on or off:
"aux" models get data of equal-length records, one batch, see make_aux_records; the tokens of every
MoE model's data are chosen so that no token is near a routing tie, see moe_routing.py), configs in transformers-v5 form (`rope_parameters`) and in the legacy
form (`rope_theta` / `rope_scaling` at the top level). Head dims are 64 or 128 (Gemma 3 also 256,
Gemma 4 also 512, the real models' widths) so the same models also serve the CUDA check. Weights use
initializer_range 0.1 and every RMSNorm weight and bias (and Gemma 4's layer_scalar buffers) is
randomised, so no parameter is trivial.

Everything is deterministic for a given --seed (torch and numpy generators are seeded per model).
Only torch, transformers, safetensors and numpy are used. Also importable: build_all(), MODELS, ...
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_routing  # noqa: E402

PARITY_SEQ_LEN = 45  # records below are designed around this cut length (odd on purpose)

# name -> spec. "kw" goes to the transformers config class; "dtype"/"shard"/"legacy_rope" to saving.
MODELS: dict[str, dict] = {
    # Llama, GQA 2:1, tied embeddings, default RoPE, odd vocab.
    "llama_gqa_tied": dict(
        arch="LlamaForCausalLM", dtype="fp32", shard=False, legacy_rope=False,
        kw=dict(vocab_size=509, hidden_size=256, intermediate_size=344, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Llama 3 style: llama3 RoPE scaling, MHA with head_dim 128, attention_bias, untied; bf16 sharded.
    "llama3rope_mha_bias": dict(
        arch="LlamaForCausalLM", dtype="bf16", shard=True, legacy_rope=False,
        kw=dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64})),
    # Mistral, GQA 4:1, untied, sliding window longer than any sequence; legacy rope_theta; fp32 sharded.
    "mistral_gqa": dict(
        arch="MistralForCausalLM", dtype="fp32", shard=True, legacy_rope=True,
        kw=dict(vocab_size=384, hidden_size=256, intermediate_size=400, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Qwen2 with q/k/v biases, GQA 2:1, tied (as the small Qwen2 models); legacy rope_theta; bf16 single.
    "qwen2_bias_tied": dict(
        arch="Qwen2ForCausalLM", dtype="bf16", shard=False, legacy_rope=True,
        kw=dict(vocab_size=1000, hidden_size=256, intermediate_size=352, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Qwen3 q_norm/k_norm, head_dim 64 != hidden/heads (= 32), GQA 2:1, untied; fp32 single.
    "qwen3_qknorm": dict(
        arch="Qwen3ForCausalLM", dtype="fp32", shard=False, legacy_rope=False,
        kw=dict(vocab_size=512, hidden_size=128, intermediate_size=320, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                attention_bias=False, use_sliding_window=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Qwen3, head_dim 128 != hidden/heads (= 96), MQA (1 KV head), tied; bf16 sharded.
    "qwen3_qknorm_tied": dict(
        arch="Qwen3ForCausalLM", dtype="bf16", shard=True, legacy_rope=False,
        kw=dict(vocab_size=509, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                attention_bias=False, use_sliding_window=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Gemma 3 text, head_dim 256 (the real models' size): local (sliding-window 16 < the parity
    # sequence length 45) and global layers alternating, linear RoPE scaling on the global layers
    # and another base on the local ones, query_pre_attn_scalar != head_dim, GQA 2:1, tied; bf16 single.
    # Config keys in the form both transformers 4.5x and 5 accept (rope_theta / rope_local_base_freq /
    # rope_scaling; v5 turns them into per-layer-type rope_parameters).
    "gemma3_hd256": dict(
        arch="Gemma3ForCausalLM", dtype="bf16", shard=False, legacy_rope=False, norm_center=0.0,
        kw=dict(vocab_size=509, hidden_size=128, intermediate_size=320, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=64,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                hidden_activation="gelu_pytorch_tanh", sliding_window=16,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                rope_theta=1000000.0, rope_local_base_freq=10000.0,
                rope_scaling={"rope_type": "linear", "factor": 4.0},
                final_logit_softcapping=None, attn_logit_softcapping=None)),
    # Gemma 3 text, head_dim 64: two local layers (window 7) then a global one, untied lm_head,
    # GQA 2:1; fp32 sharded.
    "gemma3_small": dict(
        arch="Gemma3ForCausalLM", dtype="fp32", shard=True, legacy_rope=False, norm_center=0.0,
        kw=dict(vocab_size=384, hidden_size=128, intermediate_size=272, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                hidden_activation="gelu_pytorch_tanh", sliding_window=7,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                rope_theta=1000000.0, rope_local_base_freq=100.0,
                final_logit_softcapping=None, attn_logit_softcapping=None)),
    # Gemma 4 dense (the 31B's features, transformers >= 5.5): local (window 16 < 45) and global
    # layers, global heads of the real width 512 with k = v (no v_proj) and one KV head, local head
    # dim 128 with two, proportional RoPE over a quarter of the global head, softmax scale 1, the
    # final logit soft-cap binding (5), weight-scaled norms and layer_scalar (randomised around 1),
    # tied; bf16 single file. No per-layer inputs (hidden_size_per_layer_input 0), no KV sharing.
    "gemma4_dense": dict(
        arch="Gemma4ForCausalLM", dtype="bf16", shard=False, legacy_rope=False,
        kw=dict(vocab_size=509, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=2, num_global_key_value_heads=1, head_dim=128,
                global_head_dim=512, attention_k_eq_v=True, hidden_size_per_layer_input=0,
                num_kv_shared_layers=0, max_position_embeddings=256, rms_norm_eps=1e-6,
                tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh", sliding_window=16,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                final_logit_softcapping=5.0, pad_token_id=0,
                rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1000000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    # Gemma 4 dense without k = v (global layers keep v_proj and num_key_value_heads), head dims 64 /
    # 128, the published soft-cap 30, untied lm_head, window 7; fp32 sharded.
    "gemma4_dense_fp32": dict(
        arch="Gemma4ForCausalLM", dtype="fp32", shard=True, legacy_rope=False,
        kw=dict(vocab_size=384, hidden_size=128, intermediate_size=160, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, global_head_dim=128,
                attention_k_eq_v=False, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                hidden_activation="gelu_pytorch_tanh", sliding_window=7,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                final_logit_softcapping=30.0, pad_token_id=0,
                rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1000000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    # Gemma 4 with K/V sharing (the E-models' num_kv_shared_layers, without their per-layer inputs):
    # the last two layers (one local, one global) attend to the K/V of layers 2 and 3 and have no
    # k/v projections; their MLPs double-wide; k = v, cap 10; fp32 single file.
    "gemma4_kvshared": dict(
        arch="Gemma4ForCausalLM", dtype="fp32", shard=False, legacy_rope=False,
        kw=dict(vocab_size=448, hidden_size=128, intermediate_size=128, num_hidden_layers=6,
                num_attention_heads=2, num_key_value_heads=2, num_global_key_value_heads=1, head_dim=64,
                global_head_dim=128, attention_k_eq_v=True, hidden_size_per_layer_input=0,
                num_kv_shared_layers=2, use_double_wide_mlp=True, max_position_embeddings=256,
                rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
                sliding_window=11,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention",
                             "sliding_attention", "full_attention"],
                final_logit_softcapping=10.0, pad_token_id=0,
                rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1000000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    # ---- mixture of experts (all head_dims 64: the CUDA attention kernels serve them too) ----
    # Qwen3-MoE: per-head q/k-norm, renormalised top-2 of 8, a dense layer among MoE ones
    # (mlp_only_layers), load-balancing loss on with a coefficient large enough to show in gradients.
    "qwen3moe_aux": dict(
        arch="Qwen3MoeForCausalLM", dtype="fp32", shard=False, legacy_rope=False, aux=True,
        kw=dict(vocab_size=512, hidden_size=128, intermediate_size=192, moe_intermediate_size=96,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[1], output_router_logits=True, router_aux_loss_coef=0.05,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                attention_bias=False, use_sliding_window=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Qwen3-MoE, top-3 of 6 not renormalised, no auxiliary loss; bf16 sharded.
    "qwen3moe_noaux": dict(
        arch="Qwen3MoeForCausalLM", dtype="bf16", shard=True, legacy_rope=False,
        kw=dict(vocab_size=509, hidden_size=128, intermediate_size=160, moe_intermediate_size=80,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                num_experts=6, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=1,
                mlp_only_layers=[], output_router_logits=False, max_position_embeddings=256,
                rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Mixtral: block_sparse_moe.experts.N.w1/w2/w3 names, top-2 of 4 (always renormalised), aux on.
    "mixtral_aux": dict(
        arch="MixtralForCausalLM", dtype="fp32", shard=False, legacy_rope=False, aux=True,
        kw=dict(vocab_size=384, hidden_size=128, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                output_router_logits=True, router_aux_loss_coef=0.02, max_position_embeddings=256,
                rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # OLMoE: q/k RMSNorm over the whole projection, top-4 of 8 not renormalised (its default), no aux.
    "olmoe_noaux": dict(
        arch="OlmoeForCausalLM", dtype="fp32", shard=True, legacy_rope=False,
        kw=dict(vocab_size=400, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, num_experts=8, num_experts_per_tok=4,
                norm_topk_prob=False, output_router_logits=False, max_position_embeddings=256,
                rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # OLMoE with renormalisation and the auxiliary loss (its default coefficient 0.01); bf16.
    "olmoe_aux": dict(
        arch="OlmoeForCausalLM", dtype="bf16", shard=False, legacy_rope=False, aux=True,
        kw=dict(vocab_size=448, hidden_size=128, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, num_experts=6, num_experts_per_tok=2,
                norm_topk_prob=True, output_router_logits=True, router_aux_loss_coef=0.01,
                max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
}
# transformers v5's fused experts on disk (save_pretrained(save_original_format=False)):
# mlp.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I], loaded and saved back in that layout.
# Qwen3-MoE renormalised top-2 of 6, fp32 single file; Mixtral (its block then named mlp) with the
# load-balancing loss, bf16 sharded.
MODELS["qwen3moe_fused"] = dict(MODELS["qwen3moe_noaux"], dtype="fp32", shard=False, fused=True,
                                kw=dict(MODELS["qwen3moe_noaux"]["kw"], num_experts_per_tok=2, norm_topk_prob=True))
MODELS["mixtral_fused_aux"] = dict(MODELS["mixtral_aux"], dtype="bf16", shard=True, fused=True,
                                   kw=dict(MODELS["mixtral_aux"]["kw"], intermediate_size=96))
# Gemma 4 with the E-models' per-layer input embeddings (hidden_size_per_layer_input 24: the table
# embed_tokens_per_layer [448, 6 * 24], the model projection and its norm, each layer's
# gate/projection/norm) on gemma4_kvshared (K/V shared by the last two layers, one local and one
# global, double-wide MLPs there; k = v, cap 10; fp32 single file), as gemma4_reference.py's ple_kvshared.
MODELS["gemma4_ple"] = dict(MODELS["gemma4_kvshared"],
                            kw=dict(MODELS["gemma4_kvshared"]["kw"], hidden_size_per_layer_input=24,
                                    vocab_size_per_layer_input=448))
# Gemma 4 with the 26B-A4B's MoE block beside every dense MLP (router with its weighted norm and
# per-expert scale, GeGLU experts, transformers' fused experts.gate_up_proj / down_proj): 6 experts,
# top 2 of width 64; local (window 7) and global layers, k = v, cap 30, untied head; fp32 sharded.
# Its data keep every token clear of a routing tie (moe_routing.py, is_moe()).
MODELS["gemma4_moe"] = dict(MODELS["gemma4_dense_fp32"],
                            kw=dict(MODELS["gemma4_dense_fp32"]["kw"], attention_k_eq_v=True,
                                    num_global_key_value_heads=1, enable_moe_block=True, num_experts=6,
                                    top_k_experts=2, moe_intermediate_size=64))

# Models hf_train_compare.py trains (fp32 checkpoints only; built by build_train_models()).
TRAIN_MODELS: dict[str, dict] = {
    "train_llama_gqa_tied": dict(MODELS["llama_gqa_tied"], dtype="fp32", shard=False),
    "train_qwen3_qknorm": dict(MODELS["qwen3_qknorm"], dtype="fp32", shard=True),
    "train_qwen2_bias_tied": dict(MODELS["qwen2_bias_tied"], dtype="fp32", shard=False),
    "train_mistral_gqa": dict(MODELS["mistral_gqa"], dtype="fp32", shard=False),
    "train_gemma3_small": dict(MODELS["gemma3_small"], dtype="fp32", shard=False),
    "train_qwen3moe_noaux": dict(MODELS["qwen3moe_noaux"], dtype="fp32", shard=False),
    "train_olmoe_noaux": dict(MODELS["olmoe_noaux"], dtype="fp32", shard=False),
}

# The 100-step loss-curve model (hf_train_compare.py --device cuda).
CURVE_MODEL = dict(
    arch="LlamaForCausalLM", dtype="fp32", shard=False, legacy_rope=False, init_range=0.02,
    randomize=False,
    kw=dict(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))


def quiet_transformers():
    """No progress bars / info chatter from transformers and huggingface_hub in our logs."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:
        pass


def _log(*a):
    print(*a, flush=True)


def _config_class(arch: str):
    import transformers
    return {
        "LlamaForCausalLM": transformers.LlamaConfig,
        "MistralForCausalLM": transformers.MistralConfig,
        "Qwen2ForCausalLM": transformers.Qwen2Config,
        "Qwen3ForCausalLM": transformers.Qwen3Config,
        "Gemma3ForCausalLM": transformers.Gemma3TextConfig,
        "Gemma4ForCausalLM": getattr(transformers, "Gemma4TextConfig", None),  # transformers >= 5.5
        "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
        "MixtralForCausalLM": transformers.MixtralConfig,
        "OlmoeForCausalLM": transformers.OlmoeConfig,
    }[arch]


def _model_class(arch: str):
    import transformers
    return getattr(transformers, arch)


def _make_config(spec: dict):
    """Config in transformers-v5 form (rope_parameters); falls back to rope_theta/rope_scaling kwargs."""
    cls = _config_class(spec["arch"])
    kw = dict(spec["kw"])
    kw["initializer_range"] = spec.get("init_range", 0.1)
    kw.setdefault("bos_token_id", 1)
    kw.setdefault("eos_token_id", 2)
    if "rope_parameters" not in kw:
        # Gemma 3: legacy keys (rope_theta, rope_local_base_freq, rope_scaling), which 4.5x takes and 5
        # converts; should a version refuse them, its own per-layer-type rope_parameters. The saved
        # config.json says what the model used either way (slideformer reads both forms).
        try:
            return cls(**kw)
        except (TypeError, ValueError, KeyError):
            full = {"rope_type": "default", "rope_theta": kw.pop("rope_theta")}
            full.update(kw.pop("rope_scaling", None) or {})
            local = {"rope_type": "default", "rope_theta": kw.pop("rope_local_base_freq")}
            kw["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
            return cls(**kw)
    try:
        return cls(**kw)
    except TypeError:
        # Older transformers (4.x): rope_theta + rope_scaling.
        rp = dict(kw.pop("rope_parameters"))
        kw["rope_theta"] = rp.pop("rope_theta")
        if rp.get("rope_type", "default") != "default":
            kw["rope_scaling"] = rp
        return cls(**kw)


def _rope_params_of(cfg) -> dict:
    c = cfg.to_dict()  # not attributes: per-layer values (Gemma 4) refuse attribute access
    rp = c.get("rope_parameters")
    if rp:
        return dict(rp)
    out = {"rope_type": "default", "rope_theta": c.get("rope_theta")}
    rs = c.get("rope_scaling")
    if rs:
        out.update(rs)
        out["rope_type"] = rs.get("rope_type", rs.get("type"))
    return out


def _randomize_small_params(model, gen, norm_center: float = 1.0, qk_temperature: bool = False):
    """Norm weights to norm_center + 0.2*N(0,1), biases to 0.1*N(0,1): non-trivial but well conditioned.
    Gemma's norms scale by (1 + w): their center is 0.

    qk_temperature (Gemma 4: softmax scale 1 on normed q and k): q_norm / k_norm weights to
    c (1 + 0.2 N(0,1)) with c = d^-1/4, so q.k has the usual temperature d^-1/2. Around 1 the scores
    reach +-d and the tiny models turn chaotic: a 1-ulp change of every weight moved gradients by
    6.5e-5 .. 5e-4 (relative norm, gemma4_ple at init 0.1 / 0.02), the fp32 parity tolerance; with
    d^-1/4, 2e-6 .. 4e-6 (docs/GEMMA4.md section 6)."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                c = norm_center
                if qk_temperature and (name.endswith("q_norm.weight") or name.endswith("k_norm.weight")):
                    c = p.shape[-1] ** -0.25
                    p.copy_(c * (1.0 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float32)))
                    continue
                p.copy_(c + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float32))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32))
        # Gemma 4's per-layer output scale: a checkpoint buffer (1 in a fresh model), read at load.
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(1.0 + 0.2 * torch.randn(b.shape, generator=gen, dtype=torch.float32))


def _safetensors_names(model_dir: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype string, shape) over all safetensors files of an HF directory."""
    from safetensors import safe_open
    files = sorted(model_dir.glob("*.safetensors"))
    out = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                sl = sf.get_slice(k)
                out[k] = (sl.get_dtype(), list(sl.get_shape()))
    return out


def _to_legacy_rope(model_dir: Path):
    """Rewrites config.json's rope settings in the pre-v5 form (top-level rope_theta / rope_scaling)."""
    p = model_dir / "config.json"
    cfg = json.loads(p.read_text())
    rp = cfg.pop("rope_parameters", None)
    if not rp:
        return
    rp = dict(rp)
    cfg["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type", "default")
    if rtype != "default":
        cfg["rope_scaling"] = dict(rp, rope_type=rtype)
    p.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build_model(name: str, spec: dict, out_dir: Path, seed: int) -> dict:
    """Builds, randomises and saves one model; reloads it to check the round trip. Returns a manifest entry."""
    import torch
    model_dir = out_dir / "models" / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.parent.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(seed)
    cfg = _make_config(spec)
    model = _model_class(spec["arch"])(cfg).float()
    if spec.get("randomize", True):
        gen = torch.Generator().manual_seed(seed + 1)
        _randomize_small_params(model, gen, spec.get("norm_center", 1.0),
                                spec["arch"] == "Gemma4ForCausalLM")
    ref_state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    model = model.to(dtype)
    save_kw = {}
    if spec["shard"]:
        # A few tensors per shard: exercises model.safetensors.index.json.
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        save_kw["max_shard_size"] = max(nbytes // 4, 64 * 1024)
    if spec.get("fused"):
        save_kw["save_original_format"] = False  # transformers >= 5: keep the fused runtime layout
    model.save_pretrained(str(model_dir), **save_kw)
    if spec.get("fused") and not any(k.endswith("mlp.experts.gate_up_proj") for k in _safetensors_names(model_dir)):
        raise RuntimeError(f"{name}: save_original_format=False wrote no fused experts (transformers < 5?)")
    if spec.get("legacy_rope"):
        _to_legacy_rope(model_dir)

    index = model_dir / "model.safetensors.index.json"
    if spec["shard"] and not index.exists():
        raise RuntimeError(f"{name}: expected a sharded checkpoint, got {sorted(os.listdir(model_dir))}")
    if not spec["shard"] and not (model_dir / "model.safetensors").exists():
        raise RuntimeError(f"{name}: expected model.safetensors, got {sorted(os.listdir(model_dir))}")

    # Round trip through transformers: same config meaning (rope!), same values.
    cls = _model_class(spec["arch"])
    reloaded = load_hf_model(model_dir, spec["arch"], device="cpu")
    rp_a, rp_b = _rope_params_of(cfg), _rope_params_of(reloaded.config)
    for k in set(rp_a) | set(rp_b):
        if k in ("rope_type", "type"):
            continue
        a, b = rp_a.get(k), rp_b.get(k)
        if a is not None and b is not None and a != b:
            raise RuntimeError(f"{name}: rope parameter {k} changed on reload: {a} vs {b}")
    if _rope_params_of(reloaded.config).get("rope_type", "default") != rp_a.get("rope_type", "default"):
        raise RuntimeError(f"{name}: rope_type changed on reload: {rp_a} vs {_rope_params_of(reloaded.config)}")
    for k, v in reloaded.state_dict().items():
        want = ref_state[k].to(dtype).float()
        if not torch.equal(v.float(), want):
            raise RuntimeError(f"{name}: tensor {k} differs after save/load")
    del cls

    files = _safetensors_names(model_dir)
    params = [n for n, _ in reloaded.named_parameters()]
    entry = dict(
        name=name, arch=spec["arch"], dtype=spec["dtype"], sharded=bool(spec["shard"]),
        legacy_rope=bool(spec.get("legacy_rope")), tied=bool(spec["kw"].get("tie_word_embeddings")),
        vocab_size=spec["kw"]["vocab_size"], hidden_size=spec["kw"]["hidden_size"],
        num_heads=spec["kw"]["num_attention_heads"], num_kv_heads=spec["kw"]["num_key_value_heads"],
        # from the config's dict: transformers 5.17 refuses attribute access to per-layer values
        # (Gemma 4's head_dim) with AmbiguousGlobalPerLayerAttributeError
        head_dim=int(reloaded.config.to_dict().get("head_dim") or
                     spec["kw"]["hidden_size"] // spec["kw"]["num_attention_heads"]),
        rope=_rope_params_of(reloaded.config), path=str(model_dir),
        param_names=params, file_tensors={k: v[0] for k, v in files.items()},
        file_shapes={k: v[1] for k, v in files.items()}, aux=bool(spec.get("aux")),
    )
    _log(f"  built {name:22s} {spec['arch']:19s} {spec['dtype']} "
         f"{'sharded' if spec['shard'] else 'single '} params={sum(p.numel() for p in reloaded.parameters())}")
    return entry


def load_hf_model(model_dir, arch: str | None = None, device="cpu", attn="eager"):
    """Loads an HF directory in fp32 (bf16 checkpoints are upcast exactly)."""
    import torch
    import transformers
    cls = _model_class(arch) if arch else transformers.AutoModelForCausalLM
    try:
        m = cls.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation=attn)
    except TypeError:
        m = cls.from_pretrained(str(model_dir), torch_dtype=torch.float32, attn_implementation=attn)
    m = m.float().to(device)
    m.config.use_cache = False
    return m


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------

def make_parity_records(vocab: int, seed: int, seq_len: int = PARITY_SEQ_LEN) -> list[dict]:
    """Ragged, partly masked records for eval/grad parity. Relative to seq_len (cut length):

    longer than seq_len (cut), exactly seq_len, seq_len+1, short ones, length 1 and 2, labels with -100
    spans (prompt masking, middle spans, alternating), one record fully masked, one batch-of-3 with no
    trained target at all (records 3..5), labels that differ from input_ids, ids 0 and vocab-1.
    """
    rng = np.random.default_rng(seed)
    S = seq_len

    def ids(n):
        return [int(x) for x in rng.integers(0, vocab, size=n)]

    recs: list[dict] = []
    recs.append({"input_ids": ids(30)})                                   # 0 default labels
    recs.append({"input_ids": ids(S + 15)})                               # 1 longer: cut
    r = ids(S); lab = list(r); lab[:20] = [-100] * 20
    recs.append({"input_ids": r, "labels": lab})                          # 2 prompt masked, exactly S
    recs.append({"input_ids": ids(1)})                                    # 3 length 1: nothing trained
    r = ids(25)
    recs.append({"input_ids": r, "labels": [-100] * 25})                  # 4 fully masked
    r = ids(2)
    recs.append({"input_ids": r, "labels": [r[0], -100]})                 # 5 the only target masked
    r = ids(S + 35); lab = list(r); lab[10:30] = [-100] * 20; lab[S + 5:] = [-100] * 30
    recs.append({"input_ids": r, "labels": lab})                          # 6 long, middle span masked
    r = ids(17); lab = ids(17); lab[3:6] = [-100] * 3
    recs.append({"input_ids": r, "labels": lab})                          # 7 labels != input_ids
    r = ids(S - 1); lab = [x if i % 2 == 0 else -100 for i, x in enumerate(r)]
    recs.append({"input_ids": r, "labels": lab})                          # 8 alternating mask
    r = ids(S + 1); lab = [-100] * (S + 1); lab[S - 5:] = r[S - 5:]
    recs.append({"input_ids": r, "labels": lab})                          # 9 only the tail, partly cut
    r = ids(9); r[0] = 0; r[4] = vocab - 1; r[8] = vocab - 1
    recs.append({"input_ids": r})                                         # 10 extreme ids
    recs.append({"input_ids": ids(33)})                                   # 11
    r = ids(12); lab = list(r); lab[0] = -100
    recs.append({"input_ids": r, "labels": lab})                          # 12 labels[0] never used
    recs.append({"input_ids": ids(2)})                                    # 13 one target
    return recs


def make_aux_records(vocab: int, seed: int, seq_len: int = PARITY_SEQ_LEN, n: int = 4) -> list[dict]:
    """For models with the load-balancing loss: n records of exactly seq_len tokens (no cut, no
    padding), some labels masked. transformers computes that loss over every token of one forward
    call, so the reference and slideformer must see the same single batch of n x seq_len tokens."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        r = [int(x) for x in rng.integers(0, vocab, size=seq_len)]
        lab = list(r)
        if i == 1:
            lab[:seq_len // 3] = [-100] * (seq_len // 3)
        if i == 2:
            lab[5:9] = [-100] * 4
        recs.append({"input_ids": r, "labels": lab})
    return recs


def make_train_records(vocab: int, seed: int, n: int, seq_len: int) -> list[dict]:
    """Ragged records for the 3-step AdamW comparison; every record has trained targets except one
    fully masked record (so token counts differ between micro-batches)."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        L = int(rng.integers(seq_len // 2, seq_len + 12))  # some longer than seq_len: cut
        r = [int(x) for x in rng.integers(0, vocab, size=L)]
        if i == 1:
            recs.append({"input_ids": r, "labels": [-100] * L})
        elif i % 3 == 2:
            lab = list(r); k = int(rng.integers(2, L // 2)); lab[:k] = [-100] * k
            recs.append({"input_ids": r, "labels": lab})
        else:
            recs.append({"input_ids": r})
    return recs


def write_jsonl(path: Path, recs: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def read_jsonl(path) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def is_moe(spec: dict) -> bool:
    if spec["arch"] == "Gemma4ForCausalLM":  # Gemma 4 with its MoE block beside the dense MLP
        return bool(spec["kw"].get("enable_moe_block"))
    return spec["arch"] in ("Qwen3MoeForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM")


def build_all(out_dir, seed: int = 1234, only: list[str] | None = None, models: dict | None = None,
              with_data: bool = True, init_range: float | None = None,
              route_margin: float | None = moe_routing.MOE_MIN_MARGIN) -> dict:
    """Builds the models (and their data). route_margin: the data of mixture-of-experts models is
    made with every token's top-k margin at least this (moe_routing.fix_routing_margins); None keeps
    the random tokens as drawn (near-ties included)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = MODELS if models is None else models
    manifest = {"seed": seed, "parity_seq_len": PARITY_SEQ_LEN, "init_range": init_range,
                "route_margin": route_margin, "models": {}}
    for i, (name, spec) in enumerate(models.items()):
        if only and name not in only:
            continue
        if init_range is not None:
            spec = dict(spec, init_range=init_range)
        entry = build_model(name, spec, out_dir, seed + 101 * i)
        if with_data:
            dpath = out_dir / "data" / f"{name}.jsonl"
            if spec.get("aux"):
                recs = make_aux_records(entry["vocab_size"], seed + 7 * i)
            else:
                recs = make_parity_records(entry["vocab_size"], seed + 7 * i)
            if is_moe(spec) and route_margin is not None:
                ref = load_hf_model(entry["path"], spec["arch"], device="cpu")
                ref.eval()
                recs, st = moe_routing.fix_routing_margins(ref, recs, PARITY_SEQ_LEN, entry["vocab_size"],
                                                           seed + 7 * i + 3, route_margin)
                del ref
                entry["route_margin"] = dict(st, want=route_margin)
                _log(f"  {name}: routing margins >= {route_margin:g} x logit rms: {st['replaced']} of "
                     f"{st['positions']} tokens replaced, {st['unfixed']} left below, smallest {st['min']:.3f}")
            write_jsonl(dpath, recs)
            entry["data"] = str(dpath)
        manifest["models"][name] = entry
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--init-range", type=float, default=None,
                    help="initializer_range of the weights (default 0.1)")
    ap.add_argument("--list", action="store_true", help="list the model names and exit")
    ap.add_argument("--route-margin", type=float, default=moe_routing.MOE_MIN_MARGIN,
                    help="MoE data: smallest top-k router-logit margin per token, x the logit RMS "
                         "(default %(default)s; 0 keeps random tokens, near-ties included)")
    a = ap.parse_args(argv)
    if a.list:
        for n, s in MODELS.items():
            print(n, s["arch"], s["dtype"], "sharded" if s["shard"] else "single")
        return 0
    only = [x for x in a.only.split(",") if x] or None
    if only:
        bad = [x for x in only if x not in MODELS]
        if bad:
            print(f"unknown model(s): {bad}; known: {list(MODELS)}", file=sys.stderr)
            return 2
    quiet_transformers()
    m = build_all(a.out, a.seed, only, init_range=a.init_range, route_margin=a.route_margin or None)
    print(f"wrote {len(m['models'])} models to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
