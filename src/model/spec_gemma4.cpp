#include "model/spec_gemma4.h"

#include <algorithm>
#include <cmath>

#include "core/checked_math.h"
#include "core/error.h"
#include "model/spec_gemma3.h"

namespace sf {
namespace detail {
namespace {

using json = nlohmann::json;
using L = SpecLimits;

std::string gemma4_str(const json& cfg, const char* key) { return config_string(cfg, key); }
std::string first_arch(const json& cfg) { return config_first_architecture(cfg); }

bool is_gemma4(const json& cfg) {
  const std::string mt = gemma4_str(cfg, "model_type");
  return mt == "gemma4_text" || mt == "gemma4" || first_arch(cfg).rfind("Gemma4", 0) == 0;
}

// Gemma4TextConfig's defaults (transformers 5.x), for the keys this parser reads. Published
// checkpoints write most keys, but a config written by hand or by an older save may not.
json gemma4_text_defaults() {
  return json{{"vocab_size", 262144},
              {"hidden_size", 2304},
              {"intermediate_size", 9216},
              {"num_hidden_layers", 30},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"global_head_dim", 512},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"max_position_embeddings", 131072},
              {"initializer_range", 0.02},
              {"rms_norm_eps", 1e-6},
              {"pad_token_id", 0},
              {"tie_word_embeddings", true},
              {"attention_bias", false},
              {"attention_dropout", 0.0},
              {"sliding_window", 512},
              {"vocab_size_per_layer_input", 262144},
              {"hidden_size_per_layer_input", 256},
              {"attention_k_eq_v", false},
              {"num_kv_shared_layers", 0},
              {"enable_moe_block", false},
              {"use_double_wide_mlp", false}};
}

// One layer type's RoPE from rope_parameters[type]: theta, and for "proportional" the rotated
// fraction and the linear factor. `head_dim` is that type's head dim.
void read_rope_entry(const JsonRef& e, bool global, int head_dim, int local_head_dim, RopeSpec& r,
                     double& fraction) {
  e.expect_object();
  constexpr double kMaxTheta = 1e15, kMaxFactor = 1e6;
  const std::string type = e.string_or("rope_type", "default");
  r = RopeSpec{};
  r.theta = e.number_or("rope_theta", global ? 1000000.0 : 10000.0, 0, kMaxTheta);
  if (!(r.theta > 0)) e.fail("rope_theta must be positive");
  fraction = 1.0;
  if (type == "proportional") {
    // transformers' proportional RoPE: partial_rotary_factor defaults to 1 when the entry lacks it.
    fraction = e.number_or("partial_rotary_factor", 1.0, 0, 1);
    if (!(fraction > 0)) e.fail("partial_rotary_factor must be in (0, 1]");
    r.factor = e.number_or("factor", 1.0, 0, kMaxFactor);
    if (!(r.factor > 0)) e.fail("factor must be positive");
    r.type = r.factor == 1.0 ? "default" : "linear";  // proportional divides every frequency by factor
  } else if (type == "default") {
    // transformers computes a default table over head_dim, not global_head_dim: on 512-wide
    // global heads that table does not fit the head (a shape error in transformers too).
    if (head_dim != local_head_dim)
      e.fail("rope_type 'default' on layers whose head dim (" + std::to_string(head_dim) + ") is not head_dim (" +
             std::to_string(local_head_dim) + "); Gemma 4's global layers use 'proportional'");
  } else {
    e.fail("rope_type '" + type + "' is not supported for Gemma 4 (default, proportional)");
  }
}

}  // namespace

json gemma4_text_config(const json& cfg, const std::string& path) {
  if (!is_gemma4(cfg)) return json();
  json out = gemma4_text_defaults();
  const json* text = &cfg;
  const bool outer = gemma4_str(cfg, "model_type") == "gemma4" ||
                     (cfg.contains("text_config") && gemma4_str(cfg, "model_type") != "gemma4_text") ||
                     first_arch(cfg) == "Gemma4ForConditionalGeneration";
  static const json kEmpty = json::object();
  if (outer) {
    // Gemma4Config without text_config builds the default Gemma4TextConfig.
    if (cfg.contains("text_config") && !cfg["text_config"].is_null() && !cfg["text_config"].is_object())
      input_error(path, "'text_config' of a gemma4 config must be an object (the language model's config)");
    text = cfg.contains("text_config") && cfg["text_config"].is_object() ? &cfg["text_config"] : &kEmpty;
    out["sf_multimodal"] = true;
  }
  for (auto it = text->begin(); it != text->end(); ++it) out[it.key()] = it.value();
  if (text != &cfg) {
    for (const char* k : {"model_type", "architectures", "tie_word_embeddings"})
      if (cfg.contains(k)) out[k] = cfg[k];
    for (const char* k : {"torch_dtype", "dtype"})
      if (cfg.contains(k) && !text->contains(k)) out[k] = cfg[k];
  }
  if (!out.contains("model_type") || !out["model_type"].is_string()) out["model_type"] = "gemma4_text";
  return out;
}

void apply_gemma4(const JsonRef& c, ModelSpec& s) {
  const std::string file = c.file();
  Gemma4Spec& g = s.gemma4;
  const size_t n = size_t(s.n_layer);

  const std::string act = c.string_or("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu_new")
    input_error(file, "hidden_activation '" + act + "' is not supported for gemma4 (only gelu_pytorch_tanh)");
  if (c.bool_or("attention_bias", false))
    input_error(file, "attention_bias is set; Gemma 4 checkpoints have none and slideformer does not read them");
  if (c.number_or("attention_dropout", 0.0, 0, 1) != 0.0)
    input_error(file, "attention_dropout > 0 is not supported (training runs without dropout)");
  if (c.has("use_bidirectional_attention")) {
    // "vision": image tokens see each other both ways, text stays causal (text-only training is
    // causal throughout); "all": every token both ways, not a causal language model.
    const std::string bi = c.at("use_bidirectional_attention").as_string();
    if (bi != "vision")
      input_error(file, "use_bidirectional_attention '" + bi + "' is not supported (only causal language models)");
  }
  if (c.has("attn_logit_softcapping"))
    input_error(file, "attn_logit_softcapping is set; attention soft-capping is not supported");
  g.final_softcap = 0;
  if (c.has("final_logit_softcapping")) {
    g.final_softcap = c.at("final_logit_softcapping").as_number(0, 1e6);
    if (!(g.final_softcap > 0)) input_error(file, "final_logit_softcapping must be positive or null");
  }

  if (c.bool_or("sf_multimodal", false)) {
    // Gemma4ForConditionalGeneration (transformers 5 names): the language model under model.language_model.
    s.tensor_prefix = "model.language_model.";
  }
  s.lm_head_name = "lm_head.weight";
  // Norms multiply by their weight in fp32 (weights start at 1, not Gemma 3's 1 + w); sandwich
  // norms, GeGLU, sqrt(hidden)-scaled embeddings and q/k norms as Gemma 3; softmax scale 1.
  s.gemma_norm = false;
  s.sandwich_norm = s.gelu_mlp = s.embed_scale = s.qk_norm = true;
  s.attn_scale = 1.0;

  // Layer types: layer_types when given, else every 6th layer global; transformers forces the
  // last layer global either way.
  s.local_layer.assign(n, false);
  if (std::optional<JsonRef> lt = c.get("layer_types")) {
    lt->expect_array();
    if (lt->size() != n)
      lt->fail("has " + std::to_string(lt->size()) + " entries, num_hidden_layers is " + std::to_string(n));
    for (size_t i = 0; i < n; ++i) {
      const std::string t = lt->at(i).as_string();
      if (t != "sliding_attention" && t != "full_attention")
        lt->at(i).fail("layer type '" + t + "' is not sliding_attention or full_attention");
      s.local_layer[i] = t == "sliding_attention";
    }
  } else {
    for (size_t i = 0; i < n; ++i) s.local_layer[i] = (i + 1) % 6 != 0;
  }
  s.local_layer[n - 1] = false;
  s.local_window = c.int_or("sliding_window", 512, 1, L::kMaxPositions);
  s.sliding_window = 0;  // the engine applies the local window itself (no seq-len limit)

  // Per-layer head dims and KV heads.
  g.k_eq_v = c.bool_or("attention_k_eq_v", false);
  g.head_dim.assign(n, s.head_dim);
  g.kv_heads.assign(n, s.n_kv_head);
  if (std::optional<JsonRef> plc = c.get("per_layer_config")) {
    // Newer transformers write the global layers' overrides as {"<layer>": {head_dim, num_key_value_heads}}.
    plc->expect_object();
    for (auto it = plc->json().begin(); it != plc->json().end(); ++it) {
      const JsonRef e = plc->at(it.key());
      size_t used = 0;
      int64_t l = -1;
      try {
        l = std::stoll(it.key(), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != it.key().size() || l < 0 || l >= int64_t(n))
        e.fail("is not a layer index in [0, " + std::to_string(n) + ")");
      e.expect_object();
      g.head_dim[size_t(l)] = int(e.int_or("head_dim", s.head_dim, 2, L::kMaxHeadDim));
      g.kv_heads[size_t(l)] = int(e.int_or("num_key_value_heads", s.n_kv_head, 1, L::kMaxHeads));
    }
  } else {
    const int ghd = int(c.int_or("global_head_dim", 512, 2, L::kMaxHeadDim));
    // transformers: global layers take num_global_key_value_heads only with attention_k_eq_v.
    const int gkv = int(c.int_or("num_global_key_value_heads", s.n_kv_head, 1, L::kMaxHeads));
    for (size_t l = 0; l < n; ++l) {
      if (s.local_layer[l]) continue;
      g.head_dim[l] = ghd;
      if (g.k_eq_v) g.kv_heads[l] = gkv;
    }
  }
  int global_hd = 0;
  for (size_t l = 0; l < n; ++l) {
    const std::string at = "layer " + std::to_string(l);
    if (g.head_dim[l] % 2 != 0) input_error(file, at + ": head dim " + std::to_string(g.head_dim[l]) + " is odd");
    if (s.n_head % g.kv_heads[l] != 0)
      input_error(file, at + ": num_attention_heads (" + std::to_string(s.n_head) +
                            ") is not a multiple of its key/value heads (" + std::to_string(g.kv_heads[l]) + ")");
    // One RoPE table per layer type: every layer of a type has one head dim.
    const int want = s.local_layer[l] ? s.head_dim : (global_hd ? global_hd : g.head_dim[l]);
    if (!s.local_layer[l]) global_hd = want;
    if (g.head_dim[l] != want)
      input_error(file, at + ": head dim " + std::to_string(g.head_dim[l]) + " differs from the other " +
                            (s.local_layer[l] ? "sliding" : "full") + " attention layers' (" + std::to_string(want) +
                            ")");
  }

  // RoPE per layer type (rope_parameters {sliding_attention: {...}, full_attention: {...}}).
  double local_fraction = 1.0;
  g.global_rope_fraction = 0.25;
  s.rope_local = RopeSpec{};
  s.rope = RopeSpec{};
  s.rope.theta = 1000000.0;
  std::optional<JsonRef> rp = c.get("rope_parameters");
  if (rp) {
    rp->expect_object();
    for (const char* t : {"sliding_attention", "full_attention"}) {
      const bool global = std::string(t) == "full_attention";
      bool used = false;
      for (size_t l = 0; l < n; ++l) used = used || s.local_layer[l] != global;
      if (!used) continue;
      if (!rp->has(t)) rp->fail(std::string("has no '") + t + "' entry, which the model's layers need");
      read_rope_entry(rp->at(t), global, global ? global_hd : s.head_dim, s.head_dim, global ? s.rope : s.rope_local,
                      global ? g.global_rope_fraction : local_fraction);
    }
    if (local_fraction != 1.0)
      rp->at("sliding_attention").fail("partial rotary embeddings on sliding layers are not supported");
  }

  // K/V shared across the last layers: each reuses the last earlier non-shared layer of its type.
  g.n_kv_shared = int(c.int_or("num_kv_shared_layers", 0, 0, L::kMaxLayers));
  if (g.n_kv_shared >= s.n_layer)
    input_error(file, "num_kv_shared_layers (" + std::to_string(g.n_kv_shared) +
                          ") must be smaller than num_hidden_layers (" + std::to_string(n) + ")");
  const int first_shared = s.n_layer - g.n_kv_shared;
  g.kv_source.resize(n);
  for (int l = 0; l < s.n_layer; ++l) {
    g.kv_source[size_t(l)] = l;
    if (l < first_shared) continue;
    int src = -1;
    for (int j = first_shared - 1; j >= 0 && src < 0; --j)
      if (s.local_layer[size_t(j)] == s.local_layer[size_t(l)]) src = j;
    if (src < 0)
      input_error(file, "layer " + std::to_string(l) + " shares K/V (num_kv_shared_layers) but no earlier layer of " +
                            "its type (" + (s.local_layer[size_t(l)] ? "sliding" : "full") + " attention) has its own");
    g.kv_source[size_t(l)] = src;
  }
  g.double_wide_mlp = c.bool_or("use_double_wide_mlp", false);
  g.layer_scalar.assign(n, 1.f);

  // Per-layer input embeddings.
  g.ple_dim = c.int_or("hidden_size_per_layer_input", 256, 0, L::kMaxHidden);
  g.ple_vocab = c.int_or("vocab_size_per_layer_input", s.vocab, 1, L::kMaxVocab);

  // The mixture-of-experts block beside the dense MLP (26B-A4B).
  g.moe_block = c.bool_or("enable_moe_block", false);
  if (g.moe_block) {
    for (const char* k : {"num_experts", "top_k_experts", "moe_intermediate_size"})
      if (!c.has(k)) input_error(file, std::string("enable_moe_block needs '") + k + "'");
    g.n_expert = int(c.at("num_experts").as_int(1, L::kMaxExperts));
    g.top_k = int(c.at("top_k_experts").as_int(1, L::kMaxExperts));
    g.moe_intermediate = c.at("moe_intermediate_size").as_int(1, L::kMaxIntermediate);
    if (g.top_k > g.n_expert)
      input_error(file, "top_k_experts (" + std::to_string(g.top_k) + ") exceeds num_experts (" +
                            std::to_string(g.n_expert) + ")");
    // The routed experts in the MoE fields every engine sizes its buffers from (Program::
    // gemma4_moe_*): in every layer, beside the dense MLP; renormalised top-k; transformers' fused
    // layout is Gemma 4's only one (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]);
    // no load-balancing loss (Gemma 4 has none).
    MoeSpec& m = s.moe;
    m.n_expert = g.n_expert;
    m.top_k = g.top_k;
    m.intermediate = g.moe_intermediate;
    m.norm_topk = true;
    m.fused_experts = true;
    m.is_moe.assign(size_t(n), 1);
  }
}

int64_t gemma4_layer_params(const ModelSpec& s, int l, bool active_only) {
  const Gemma4Spec& g = s.gemma4;
  const std::string what = "parameters of a layer";
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, s.source, what); };
  auto add = [&](int64_t a, int64_t b) { return checked_add(a, b, s.source, what); };
  const int64_t H = s.hidden, hd = g.head_dim[size_t(l)];
  const int64_t Q = mul(s.n_head, hd), KV = mul(g.kv_heads[size_t(l)], hd);
  const bool global = !s.is_local(l);
  int64_t n = mul(4, H);                  // input, post-attention, pre- and post-feedforward norms
  n = add(n, add(mul(mul(2, H), Q), hd));  // q, o; q_norm
  if (!g.kv_shared(l)) {
    n = add(n, add(mul(H, KV), hd));                 // k; k_norm (v_norm has no weight)
    if (!(g.k_eq_v && global)) n = add(n, mul(H, KV));  // v
  }
  n = add(n, mul(3, mul(H, g.mlp_intermediate(l, s.intermediate))));  // gate, up, down
  if (g.ple_dim > 0) n = add(n, add(mul(mul(2, H), g.ple_dim), H));  // input gate, projection; its norm
  if (g.moe_block) {
    const int64_t experts = active_only ? g.top_k : g.n_expert;
    n = add(n, add(mul(g.n_expert, H), add(H, g.n_expert)));          // router proj, scale, per_expert_scale
    n = add(n, mul(experts, mul(3, mul(H, g.moe_intermediate))));    // gate_up, down of each expert
    n = add(n, mul(3, H));  // pre_feedforward_layernorm_2, post_feedforward_layernorm_1, _2
  }
  return n;
}

int64_t gemma4_model_params(const ModelSpec& s) {
  const Gemma4Spec& g = s.gemma4;
  if (g.ple_dim == 0) return 0;
  const std::string what = "parameters of the model";
  const int64_t width = checked_mul(int64_t(s.n_layer), g.ple_dim, s.source, what);  // L * P
  const int64_t table = checked_mul(g.ple_vocab, width, s.source, what);              // embed_tokens_per_layer
  const int64_t proj = checked_mul(s.hidden, width, s.source, what);                  // per_layer_model_projection
  return checked_add(checked_add(table, proj, s.source, what), g.ple_dim, s.source, what);  // + its norm
}

std::string gemma4_missing(const ModelSpec& s) {
  // Each item names the config key that asks for it. Everything read trains now (the dense model,
  // k = v, proportional RoPE, per-layer head dims, the soft-capped head, K/V sharing, double-wide
  // MLPs, per-layer input embeddings and the MoE block: docs/GEMMA4.md); a part read later that
  // cannot train yet is listed here.
  (void)s;
  return {};
}

}  // namespace detail

int64_t Gemma4Spec::mlp_intermediate(int l, int64_t intermediate) const {
  // transformers: double width on KV-shared layers only (and never when nothing is shared).
  return double_wide_mlp && kv_shared(l) ? 2 * intermediate : intermediate;
}

}  // namespace sf
