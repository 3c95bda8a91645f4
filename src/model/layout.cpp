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
  add(s, emb, "model.embed_tokens.weight", {s.vocab, H});
  m.blobs.push_back(std::move(emb));

  for (int l = 0; l < s.n_layer; ++l) {
    BlobLayout b;
    b.kind = BlobKind::Layer;
    b.layer = l;
    std::string p = "model.layers." + std::to_string(l) + ".";
    using P = LayerParam;
    add(s, b, p + "input_layernorm.weight", {H}, int(P::InputNorm));
    add(s, b, p + "self_attn.q_proj.weight", {Q, H}, int(P::Wq));
    if (s.qkv_bias) add(s, b, p + "self_attn.q_proj.bias", {Q}, int(P::Bq));
    add(s, b, p + "self_attn.k_proj.weight", {KV, H}, int(P::Wk));
    if (s.qkv_bias) add(s, b, p + "self_attn.k_proj.bias", {KV}, int(P::Bk));
    add(s, b, p + "self_attn.v_proj.weight", {KV, H}, int(P::Wv));
    if (s.qkv_bias) add(s, b, p + "self_attn.v_proj.bias", {KV}, int(P::Bv));
    add(s, b, p + "self_attn.o_proj.weight", {H, Q}, int(P::Wo));
    if (s.o_bias) add(s, b, p + "self_attn.o_proj.bias", {H}, int(P::Bo));
    if (s.qk_norm) {
      add(s, b, p + "self_attn.q_norm.weight", {s.head_dim}, int(P::QNorm));
      add(s, b, p + "self_attn.k_norm.weight", {s.head_dim}, int(P::KNorm));
    }
    add(s, b, p + "post_attention_layernorm.weight", {H}, int(P::PostNorm));
    add(s, b, p + "mlp.gate_proj.weight", {I, H}, int(P::Wgate));
    if (s.mlp_bias) add(s, b, p + "mlp.gate_proj.bias", {I}, int(P::Bgate));
    add(s, b, p + "mlp.up_proj.weight", {I, H}, int(P::Wup));
    if (s.mlp_bias) add(s, b, p + "mlp.up_proj.bias", {I}, int(P::Bup));
    add(s, b, p + "mlp.down_proj.weight", {H, I}, int(P::Wdown));
    if (s.mlp_bias) add(s, b, p + "mlp.down_proj.bias", {H}, int(P::Bdown));
    m.blobs.push_back(std::move(b));
  }

  BlobLayout head;
  head.kind = BlobKind::Head;
  add(s, head, "model.norm.weight", {H});
  if (!s.tie_embeddings) add(s, head, "lm_head.weight", {s.vocab, H});
  m.blobs.push_back(std::move(head));
  return m;
}

Tensor entry_view(const BlobEntry& e, void* base, DType dtype) {
  char* p = static_cast<char*>(base) + e.offset * int64_t(dtype_size(dtype));
  if (e.shape.size() == 2) return Tensor(p, dtype, {e.shape[0], e.shape[1]});
  return Tensor(p, dtype, {e.numel});
}

LayerParams layer_views(const BlobLayout& b, void* base, DType dtype) {
  LayerParams lp;
  for (const auto& e : b.entries)
    if (e.param >= 0) lp.t[e.param] = entry_view(e, base, dtype);
  return lp;
}

}  // namespace sf
