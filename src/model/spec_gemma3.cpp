#include "model/spec_gemma3.h"

#include <cmath>

#include "core/error.h"

namespace sf::detail {
namespace {

using json = nlohmann::json;
using L = SpecLimits;

std::string gemma3_str(const json& cfg, const char* key) { return config_string(cfg, key); }

bool is_gemma3(const json& cfg) {
  const std::string mt = gemma3_str(cfg, "model_type");
  const std::string arch = config_first_architecture(cfg);
  return mt == "gemma3_text" || mt == "gemma3" || arch == "Gemma3ForCausalLM" ||
         arch == "Gemma3ForConditionalGeneration";
}

// Gemma3TextConfig's defaults (transformers), for the keys this parser reads.
json gemma3_text_defaults() {
  return json{{"vocab_size", 262208},
              {"hidden_size", 2304},
              {"intermediate_size", 9216},
              {"num_hidden_layers", 26},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"head_dim", 256},
              {"hidden_activation", "gelu_pytorch_tanh"},
              {"max_position_embeddings", 131072},
              {"initializer_range", 0.02},
              {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", true},
              {"rope_theta", 1000000.0},
              {"rope_local_base_freq", 10000.0},
              {"attention_bias", false},
              {"query_pre_attn_scalar", 256},
              {"sliding_window", 4096},
              {"sliding_window_pattern", 6}};
}

// One layer type's RoPE from a transformers v5 rope_parameters entry.
RopeSpec rope_of(const JsonRef& c, const JsonRef& entry) {
  entry.expect_object();
  json wrap{{"rope_parameters", entry.json()}};
  ModelSpec tmp;
  parse_rope(JsonRef(wrap, c.file()), tmp);
  return tmp.rope;
}

}  // namespace

std::string config_string(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  return it != cfg.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string config_first_architecture(const json& cfg) {
  if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
      cfg["architectures"][0].is_string())
    return cfg["architectures"][0].get<std::string>();
  return {};
}

json gemma3_text_config(const json& cfg, const std::string& path) {
  if (!is_gemma3(cfg)) return json();
  json out = gemma3_text_defaults();
  const json* text = &cfg;
  if (gemma3_str(cfg, "model_type") == "gemma3" ||
      (cfg.contains("text_config") && gemma3_str(cfg, "model_type") != "gemma3_text")) {
    if (!cfg.contains("text_config") || !cfg["text_config"].is_object())
      input_error(path, "a gemma3 config needs a 'text_config' object (the language model's config)");
    text = &cfg["text_config"];
    out["sf_multimodal"] = true;
  }
  for (auto it = text->begin(); it != text->end(); ++it) out[it.key()] = it.value();
  for (const char* k : {"model_type", "architectures", "torch_dtype", "dtype", "tie_word_embeddings"}) {
    // The outer config's say wins for what the whole checkpoint is; dtype only when the text
    // config has none.
    if (!cfg.contains(k) || &cfg == text) continue;
    const bool outer_wins =
        std::string(k) == "model_type" || std::string(k) == "architectures" || std::string(k) == "tie_word_embeddings";
    if (outer_wins || !text->contains(k)) out[k] = cfg[k];
  }
  if (!out.contains("model_type") || !out["model_type"].is_string()) out["model_type"] = "gemma3_text";
  return out;
}

void apply_gemma3(const JsonRef& c, ModelSpec& s) {
  const std::string file = c.file();
  const std::string act = c.string_or("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh" && act != "gelu_new")
    input_error(file, "hidden_activation '" + act + "' is not supported for gemma3 (only gelu_pytorch_tanh)");
  for (const char* cap : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    if (c.has(cap))
      input_error(file, std::string(cap) + " is set; logit soft-capping is not supported (Gemma 3 configs have null)");
  }
  if (c.bool_or("use_bidirectional_attention", false))
    input_error(file, "use_bidirectional_attention is not supported (only causal language models)");

  if (c.bool_or("sf_multimodal", false)) {
    // Gemma3ForConditionalGeneration checkpoints as published (transformers < 4.52 names).
    s.tensor_prefix = "language_model.model.";
    s.lm_head_name = "language_model.lm_head.weight";
  }
  s.gemma_norm = s.sandwich_norm = s.gelu_mlp = s.embed_scale = true;
  s.qk_norm = true;
  s.qkv_bias = s.o_bias = c.bool_or("attention_bias", false);
  const double qpas = c.number_or("query_pre_attn_scalar", 256, 1e-6, 1e12);
  s.attn_scale = 1.0 / std::sqrt(qpas);

  // Layer types: layer_types when given, else every sliding_window_pattern-th layer is global.
  s.local_layer.assign(size_t(s.n_layer), false);
  if (std::optional<JsonRef> lt = c.get("layer_types")) {
    lt->expect_array();
    if (lt->size() != size_t(s.n_layer))
      lt->fail("has " + std::to_string(lt->size()) + " entries, num_hidden_layers is " + std::to_string(s.n_layer));
    for (size_t i = 0; i < lt->size(); ++i) {
      const std::string t = lt->at(i).as_string();
      if (t != "sliding_attention" && t != "full_attention")
        lt->at(i).fail("layer type '" + t + "' is not sliding_attention or full_attention");
      s.local_layer[i] = t == "sliding_attention";
    }
  } else {
    int64_t pattern = c.int_or("sliding_window_pattern", 6, 1, L::kMaxLayers);
    pattern = c.int_or("_sliding_window_pattern", pattern, 1, L::kMaxLayers);
    for (int i = 0; i < s.n_layer; ++i) s.local_layer[size_t(i)] = (i + 1) % pattern != 0;
  }
  s.local_window = c.int_or("sliding_window", 4096, 1, L::kMaxPositions);
  s.sliding_window = 0;  // the engine applies the local window itself (no seq-len limit)

  // RoPE: global layers rope_theta (+ rope_scaling), local ones rope_local_base_freq; or the
  // per-layer-type dicts of transformers v5's rope_parameters.
  std::optional<JsonRef> rp = c.get("rope_parameters");
  if (rp && rp->has("full_attention")) {
    s.rope = rope_of(c, rp->at("full_attention"));
    s.rope_local = rp->has("sliding_attention") ? rope_of(c, rp->at("sliding_attention")) : s.rope;
  } else {
    // spec.cpp's parse_rope has read rope_theta / rope_scaling into s.rope already.
    s.rope_local = RopeSpec{};
    s.rope_local.theta = c.number_or("rope_local_base_freq", 10000.0, 1e-6, 1e15);
  }
}

}  // namespace sf::detail
