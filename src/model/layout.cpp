#include "model/layout.h"

#include <algorithm>

#include "core/checked_math.h"
#include "core/error.h"

namespace sf {
namespace {

constexpr int64_t kAlign = 128;  // elements: 256 bytes for bf16, 512 for fp32

// Sizes in checked arithmetic: parse_model_spec bounds the dimensions, this keeps a spec built
// any other way from wrapping around (an overflow is an InputError naming the spec's source).
void add(const ModelSpec& s, BlobLayout& b, std::string name, std::vector<int64_t> shape, int param = -1) {
  BlobEntry e;
  e.name = std::move(name);
  e.shape = std::move(shape);
  e.numel = 1;
  for (int64_t d : e.shape) {
    if (d < 0) input_error(s.source, "tensor " + e.name + " has a negative dimension");
    e.numel = checked_mul(e.numel, d, s.source, "elements of " + e.name);
  }
  e.offset = b.numel;
  e.param = param;
  b.numel = checked_add(b.numel, checked_add(e.numel, kAlign - 1, s.source, "blob size"), s.source, "blob size") /
            kAlign * kAlign;
  b.entries.push_back(std::move(e));
}

// A linear layer: its weight [out, in] and, when the family has one, its bias [out].
void add_linear(const ModelSpec& s, BlobLayout& b, const std::string& name, int64_t out, int64_t in, LayerParam w,
                bool bias, LayerParam bias_param) {
  add(s, b, name + ".weight", {out, in}, int(w));
  if (bias) add(s, b, name + ".bias", {out}, int(bias_param));
}

// A MoE layer's router and experts under transformers' per-expert checkpoint names (what
// transformers writes by default, v4 and v5 alike): qwen3_moe / olmoe "mlp.gate",
// "mlp.experts.N.{gate,up,down}_proj"; mixtral "block_sparse_moe.gate", "...experts.N.{w1,w3,w2}".
// All experts of one matrix kind are consecutive, so that one view [E, stride] covers them.
// Returns the router's entry index (the E gate, E up and E down entries follow it).
int add_experts(const ModelSpec& s, BlobLayout& b, const std::string& p) {
  using P = LayerParam;
  const int64_t H = s.hidden, I = s.moe.intermediate;
  const bool mx = s.moe.mixtral_names;
  const std::string block = p + (mx ? "block_sparse_moe." : "mlp.");
  const int router = int(b.entries.size());
  add(s, b, block + "gate.weight", {s.moe.n_expert, H}, int(P::Router));
  struct Kind {
    const char* hf;
    const char* mixtral;
    P param;
    int64_t rows, cols;
  };
  for (const Kind& k : {Kind{"gate_proj", "w1", P::ExpGate, I, H}, Kind{"up_proj", "w3", P::ExpUp, I, H},
                        Kind{"down_proj", "w2", P::ExpDown, H, I}}) {
    for (int e = 0; e < s.moe.n_expert; ++e) {
      add(s, b, block + "experts." + std::to_string(e) + "." + (mx ? k.mixtral : k.hf) + ".weight", {k.rows, k.cols},
          e == 0 ? int(k.param) : -1);
      if (e == 0) b.entries.back().group = s.moe.n_expert;
    }
  }
  return router;
}

// transformers v5's fused experts (save_original_format=False; its runtime parameters): every family's
// block is "mlp." (Mixtral's renamed), the router "mlp.gate.weight" [E, H],
// "mlp.experts.gate_up_proj" [E, 2I, H] (expert e's gate rows, then its up rows) and
// "mlp.experts.down_proj" [E, H, I]: expert e's matrices are contiguous slices.
void store_fused_experts(const ModelSpec& s, BlobLayout& b, const std::string& p, int router) {
  const int64_t H = s.hidden, I = s.moe.intermediate, E = s.moe.n_expert;
  const std::string block = p + "mlp.";
  b.stored.push_back({block + "gate.weight", {E, H}, {{router, 0}}});
  StoredTensor gate_up{block + "experts.gate_up_proj", {E, 2 * I, H}, {}};
  StoredTensor down{block + "experts.down_proj", {E, H, I}, {}};
  for (int64_t e = 0; e < E; ++e) {
    gate_up.parts.push_back({router + 1 + int(e), 2 * e * I * H});
    gate_up.parts.push_back({router + 1 + int(E + e), (2 * e + 1) * I * H});
    down.parts.push_back({router + 1 + int(2 * E + e), e * H * I});
  }
  b.stored.push_back(std::move(gate_up));
  b.stored.push_back(std::move(down));
}

// Every entry not yet stored is a tensor of its own, in entry order (after the fused ones: the
// order of tensors in a file is free).
void store_entries(BlobLayout& b) {
  std::vector<char> done(b.entries.size(), 0);
  for (const StoredTensor& t : b.stored)
    for (const StoredPart& part : t.parts) done[size_t(part.entry)] = 1;
  for (size_t i = 0; i < b.entries.size(); ++i)
    if (!done[i]) b.stored.push_back({b.entries[i].name, b.entries[i].shape, {{int(i), 0}}});
}

// Gemma 4's MoE block (docs/GEMMA4.md section 3), in transformers' order after the MLP and the
// per-layer input: router.{proj.weight, scale, per_expert_scale}, the experts (one entry per
// expert and matrix, all experts of a kind consecutive, as add_experts; stored only as
// transformers' fused experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I], the
// layout transformers 5.17 saves), then the three norms.
void add_gemma4_moe(const ModelSpec& s, BlobLayout& b, const std::string& p) {
  using P = LayerParam;
  const int64_t H = s.hidden, I = s.moe.intermediate, E = s.moe.n_expert;
  add(s, b, p + "router.proj.weight", {E, H}, int(P::Router));
  add(s, b, p + "router.scale", {H}, int(P::RouterScale));
  add(s, b, p + "router.per_expert_scale", {E}, int(P::ExpertScale));
  const int first = int(b.entries.size());
  struct Kind {
    const char* name;
    P param;
    int64_t rows, cols;
  };
  for (const Kind& k : {Kind{"gate", P::ExpGate, I, H}, Kind{"up", P::ExpUp, I, H}, Kind{"down", P::ExpDown, H, I}})
    for (int64_t e = 0; e < E; ++e) {  // names of the blob's entries only: never stored under them
      add(s, b, p + "experts." + std::to_string(e) + "." + k.name, {k.rows, k.cols}, e == 0 ? int(k.param) : -1);
      if (e == 0) b.entries.back().group = int(E);
    }
  StoredTensor gate_up{p + "experts.gate_up_proj", {E, 2 * I, H}, {}};
  StoredTensor down{p + "experts.down_proj", {E, H, I}, {}};
  for (int64_t e = 0; e < E; ++e) {
    gate_up.parts.push_back({first + int(e), 2 * e * I * H});
    gate_up.parts.push_back({first + int(E + e), (2 * e + 1) * I * H});
    down.parts.push_back({first + int(2 * E + e), e * H * I});
  }
  b.stored.push_back(std::move(gate_up));
  b.stored.push_back(std::move(down));
  add(s, b, p + "post_feedforward_layernorm_1.weight", {H}, int(P::MlpOutNorm1));
  add(s, b, p + "post_feedforward_layernorm_2.weight", {H}, int(P::MoeOutNorm));
  add(s, b, p + "pre_feedforward_layernorm_2.weight", {H}, int(P::MoeInNorm));
}

// A Gemma 4 decoder layer (docs/GEMMA4.md section 3): its own head dim and KV heads; no v_proj on
// global layers with attention_k_eq_v; no k/v projections or k_norm on KV-shared layers (and no
// v_norm tensor anywhere: the value norm has no weight); the MLP per layer (double-wide ones).
// layer_scalar is a buffer, not a parameter: not in the blob.
void add_gemma4_layer(const ModelSpec& s, BlobLayout& b, const std::string& p, int l) {
  using P = LayerParam;
  const Gemma4Spec& g = s.gemma4;
  const int64_t H = s.hidden, d = g.head_dim[size_t(l)];
  const int64_t Q = checked_mul(int64_t(s.n_head), d, s.source, "q_proj rows");
  const int64_t KV = checked_mul(int64_t(g.kv_heads[size_t(l)]), d, s.source, "k_proj rows");
  const int64_t I = g.mlp_intermediate(l, s.intermediate);
  const bool shared = g.kv_shared(l), no_v = shared || (g.k_eq_v && !s.is_local(l));
  add(s, b, p + "input_layernorm.weight", {H}, int(P::InputNorm));
  add(s, b, p + "self_attn.q_proj.weight", {Q, H}, int(P::Wq));
  if (!shared) add(s, b, p + "self_attn.k_proj.weight", {KV, H}, int(P::Wk));
  if (!no_v) add(s, b, p + "self_attn.v_proj.weight", {KV, H}, int(P::Wv));
  add(s, b, p + "self_attn.o_proj.weight", {H, Q}, int(P::Wo));
  add(s, b, p + "self_attn.q_norm.weight", {d}, int(P::QNorm));
  if (!shared) add(s, b, p + "self_attn.k_norm.weight", {d}, int(P::KNorm));
  add(s, b, p + "post_attention_layernorm.weight", {H}, int(P::AttnOutNorm));
  add(s, b, p + "pre_feedforward_layernorm.weight", {H}, int(P::PostNorm));
  add(s, b, p + "post_feedforward_layernorm.weight", {H}, int(P::FfnOutNorm));
  add(s, b, p + "mlp.gate_proj.weight", {I, H}, int(P::Wgate));
  add(s, b, p + "mlp.up_proj.weight", {I, H}, int(P::Wup));
  add(s, b, p + "mlp.down_proj.weight", {H, I}, int(P::Wdown));
  if (g.ple_dim > 0) {  // transformers' order: after the MLP
    add(s, b, p + "per_layer_input_gate.weight", {g.ple_dim, H}, int(P::PleGate));
    add(s, b, p + "per_layer_projection.weight", {H, g.ple_dim}, int(P::PleProj));
    add(s, b, p + "post_per_layer_input_norm.weight", {H}, int(P::PleNorm));
  }
  if (g.moe_block) add_gemma4_moe(s, b, p);
}

// Gemma 4's model-level per-layer input tensors, in the embedding blob after the table (PleEntry).
void add_gemma4_ple_model(const ModelSpec& s, BlobLayout& emb) {
  const Gemma4Spec& g = s.gemma4;
  const int64_t width = checked_mul(int64_t(s.n_layer), g.ple_dim, s.source, "embed_tokens_per_layer columns");
  add(s, emb, s.tensor_prefix + "embed_tokens_per_layer.weight", {g.ple_vocab, width});
  add(s, emb, s.tensor_prefix + "per_layer_model_projection.weight", {width, s.hidden});
  add(s, emb, s.tensor_prefix + "per_layer_projection_norm.weight", {g.ple_dim});
}

}  // namespace

const BlobEntry* BlobLayout::entry(LayerParam p) const {
  for (const auto& e : entries)
    if (e.param == int(p)) return &e;
  return nullptr;
}

int64_t ModelLayout::total_numel() const {
  int64_t n = 0;
  for (const auto& b : blobs) n = checked_add(n, b.numel, "", "elements of the model");
  return n;
}

int64_t ModelLayout::max_blob_numel() const {
  int64_t n = 0;
  for (const auto& b : blobs) n = std::max(n, b.numel);
  return n;
}

ModelLayout make_layout(const ModelSpec& s) {
  ModelLayout m;
  // One entry per layer is built below: bounded first (parse_model_spec checks this too).
  if (s.n_layer < 0 || s.n_layer > SpecLimits::kMaxLayers)
    input_error(s.source, "num_hidden_layers " + std::to_string(s.n_layer) + " is out of range [1, " +
                              std::to_string(SpecLimits::kMaxLayers) + "]");
  const int64_t H = s.hidden, Q = s.q_dim(), KV = s.kv_dim(), I = s.intermediate;

  BlobLayout emb;
  emb.kind = BlobKind::Embedding;
  add(s, emb, s.tensor_prefix + "embed_tokens.weight", {s.vocab, H});
  if (s.arch == Arch::Gemma4 && s.gemma4.ple_dim > 0) add_gemma4_ple_model(s, emb);
  m.blobs.push_back(std::move(emb));

  for (int l = 0; l < s.n_layer; ++l) {
    BlobLayout b;
    b.kind = BlobKind::Layer;
    b.layer = l;
    std::string p = s.tensor_prefix + "layers." + std::to_string(l) + ".";
    if (s.arch == Arch::Gemma4) {
      add_gemma4_layer(s, b, p, l);
      m.blobs.push_back(std::move(b));
      continue;
    }
    using P = LayerParam;
    add(s, b, p + "input_layernorm.weight", {H}, int(P::InputNorm));
    add_linear(s, b, p + "self_attn.q_proj", Q, H, P::Wq, s.qkv_bias, P::Bq);
    add_linear(s, b, p + "self_attn.k_proj", KV, H, P::Wk, s.qkv_bias, P::Bk);
    add_linear(s, b, p + "self_attn.v_proj", KV, H, P::Wv, s.qkv_bias, P::Bv);
    add_linear(s, b, p + "self_attn.o_proj", H, Q, P::Wo, s.o_bias, P::Bo);
    if (s.qk_norm) {
      add(s, b, p + "self_attn.q_norm.weight", {s.qk_norm_full ? Q : s.head_dim}, int(P::QNorm));
      add(s, b, p + "self_attn.k_norm.weight", {s.qk_norm_full ? KV : s.head_dim}, int(P::KNorm));
    }
    if (s.sandwich_norm) {
      add(s, b, p + "post_attention_layernorm.weight", {H}, int(P::AttnOutNorm));
      add(s, b, p + "pre_feedforward_layernorm.weight", {H}, int(P::PostNorm));
      add(s, b, p + "post_feedforward_layernorm.weight", {H}, int(P::FfnOutNorm));
    } else {
      add(s, b, p + "post_attention_layernorm.weight", {H}, int(P::PostNorm));
    }
    if (s.moe_layer(l)) {
      const int router = add_experts(s, b, p);
      if (s.moe.fused_experts) store_fused_experts(s, b, p, router);
    } else {
      add_linear(s, b, p + "mlp.gate_proj", I, H, P::Wgate, s.mlp_bias, P::Bgate);
      add_linear(s, b, p + "mlp.up_proj", I, H, P::Wup, s.mlp_bias, P::Bup);
      add_linear(s, b, p + "mlp.down_proj", H, I, P::Wdown, s.mlp_bias, P::Bdown);
    }
    m.blobs.push_back(std::move(b));
  }

  BlobLayout head;
  head.kind = BlobKind::Head;
  add(s, head, s.tensor_prefix + "norm.weight", {H});
  if (!s.tie_embeddings) add(s, head, s.lm_head_name, {s.vocab, H});
  m.blobs.push_back(std::move(head));
  for (BlobLayout& b : m.blobs) {
    b.norm_init = s.gemma_norm ? 0.f : 1.f;
    store_entries(b);
  }
  return m;
}

Tensor entry_view(const BlobEntry& e, void* base, DType dtype) {
  char* p = static_cast<char*>(base) + e.offset * int64_t(dtype_size(dtype));
  if (e.shape.size() == 2) return Tensor(p, dtype, {e.shape[0], e.shape[1]});
  return Tensor(p, dtype, {e.numel});
}

LayerParams layer_views(const BlobLayout& b, void* base, DType dtype) {
  LayerParams lp;
  lp.layer = b.layer;
  for (const auto& e : b.entries) {
    if (e.param < 0) continue;
    const LayerParam lp_kind = LayerParam(e.param);
    if (lp_kind == LayerParam::ExpGate || lp_kind == LayerParam::ExpUp || lp_kind == LayerParam::ExpDown) {
      // add() spaces the E entries round_up(numel, kAlign) apart.
      char* p = static_cast<char*>(base) + e.offset * int64_t(dtype_size(dtype));
      lp.t[e.param] = Tensor(p, dtype, {int64_t(e.group), (e.numel + kAlign - 1) / kAlign * kAlign});
      continue;
    }
    lp.t[e.param] = entry_view(e, base, dtype);
  }
  return lp;
}

}  // namespace sf
