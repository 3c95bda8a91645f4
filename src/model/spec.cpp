#include "model/spec.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/checked_math.h"
#include "core/error.h"
#include "io/json_file.h"
#include "model/spec_gemma3.h"
#include "model/spec_gemma4.h"

namespace sf {
namespace {

using json = nlohmann::json;
using L = SpecLimits;

}  // namespace

void detail::parse_rope(const JsonRef& c, ModelSpec& s) {
  // transformers v5 keeps everything in rope_parameters; older configs use rope_theta + rope_scaling.
  std::optional<JsonRef> rp = c.get("rope_parameters");
  if (rp && !rp->json().is_object()) rp.reset();  // v5 may nest per-layer-type dicts: not ours
  if (!rp) {
    rp = c.get("rope_scaling");
    if (rp) rp->expect_object();
  }
  constexpr double kMaxTheta = 1e15, kMaxFactor = 1e6;
  s.rope.theta = c.number_or("rope_theta", 10000.0, 0, kMaxTheta);
  if (rp) {
    s.rope.theta = rp->number_or("rope_theta", s.rope.theta, 0, kMaxTheta);
    std::string type = "default";
    if (rp->has("rope_type")) {
      type = rp->at("rope_type").as_string();
    } else if (rp->has("type")) {  // legacy alias
      type = rp->at("type").as_string();
    }
    if (type != "default" && type != "linear" && type != "llama3") {
      input_error(c.file(), "rope scaling type '" + type + "' is not supported (supported: default, linear, llama3)");
    }
    s.rope.type = type;
    if (type != "default") {
      if (!rp->has("factor")) rp->fail("rope scaling '" + type + "' needs a positive 'factor'");
      s.rope.factor = rp->at("factor").as_number(0, kMaxFactor);
      if (!(s.rope.factor > 0)) rp->fail("rope scaling '" + type + "' needs a positive 'factor'");
    }
    if (type == "llama3") {
      s.rope.low_freq_factor = rp->number_or("low_freq_factor", 1.0, 0, kMaxFactor);
      s.rope.high_freq_factor = rp->number_or("high_freq_factor", 4.0, 0, kMaxFactor);
      s.rope.original_max_position = rp->int_or("original_max_position_embeddings", 8192, 1, L::kMaxPositions);
      if (!(s.rope.low_freq_factor > 0 && s.rope.high_freq_factor > s.rope.low_freq_factor)) {
        rp->fail("llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor");
      }
    }
  }
  if (!(s.rope.theta > 0)) input_error(c.file(), "'rope_theta' must be positive");
}

namespace {

// The MoE fields, with transformers' defaults where config.json leaves them out.
void parse_moe(const JsonRef& c, ModelSpec& s) {
  MoeSpec& m = s.moe;
  const bool qwen = s.arch == Arch::Qwen3Moe, mixtral = s.arch == Arch::Mixtral, olmoe = s.arch == Arch::Olmoe;
  if (!qwen && !mixtral && !olmoe) return;
  // transformers 5 may write the expert count of every family as num_local_experts (Mixtral's
  // name): either key is read, num_experts first.
  // At least one expert, but for Qwen3-MoE, whose layers are dense without experts (transformers:
  // a layer is sparse only where num_experts > 0); Mixtral's and OLMoE's layers always route.
  const int64_t dflt = mixtral ? 8 : qwen ? 128 : 64, least = qwen ? 0 : 1;
  m.n_expert = int(c.has("num_experts") ? c.int_or("num_experts", dflt, least, L::kMaxExperts)
                                        : c.int_or("num_local_experts", dflt, least, L::kMaxExperts));
  m.top_k = int(c.int_or("num_experts_per_tok", mixtral ? 2 : 8, 1, L::kMaxExperts));
  m.intermediate = qwen ? c.int_or("moe_intermediate_size", 768, 1, L::kMaxIntermediate) : s.intermediate;
  m.norm_topk = mixtral ? true : c.bool_or("norm_topk_prob", false);
  m.mixtral_names = mixtral;
  m.aux_loss = c.bool_or("output_router_logits", false);
  m.aux_coef = c.number_or("router_aux_loss_coef", olmoe ? 0.01 : 0.001, -1e6, 1e6);
  if (mixtral && c.number_or("router_jitter_noise", 0.0, 0, 1e6) != 0.0)
    input_error(c.file(), "router_jitter_noise > 0 is not supported (Mixtral checkpoints use 0)");
  m.is_moe.assign(size_t(s.n_layer), 1);
  if (qwen) {
    // transformers: layer l is sparse iff l is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
    // (0: transformers' modulo by zero; refused)
    const int64_t step = c.int_or("decoder_sparse_step", 1, 1, L::kMaxLayers);
    for (int l = 0; l < s.n_layer; ++l) m.is_moe[size_t(l)] = m.n_expert > 0 && (l + 1) % step == 0;
    if (std::optional<JsonRef> only = c.get("mlp_only_layers")) {
      only->expect_array();
      for (size_t i = 0; i < only->size(); ++i) {
        const int64_t l = only->at(i).as_int(0, L::kMaxLayers);
        if (l < s.n_layer) m.is_moe[size_t(l)] = 0;
      }
    }
  }
  if (m.n_expert == 0 || m.moe_layers() == 0) {  // qwen3_moe without sparse layers: a dense model
    m = MoeSpec{};
    return;
  }
  if (m.top_k > m.n_expert)
    input_error(c.file(), "num_experts_per_tok (" + std::to_string(m.top_k) + ") exceeds the number of experts (" +
                              std::to_string(m.n_expert) + ")");
}

}  // namespace

int MoeSpec::moe_layers() const {
  int n = 0;
  for (char m : is_moe) n += m != 0;
  return n;
}

namespace {

// Parameters of one decoder layer whose MLP has `experts` experts of intermediate size I (0
// experts: the dense MLP) of which `active` are counted (all for the stored size, top_k for the
// ones a token multiplies).
int64_t count_layer_params(const ModelSpec& s, bool moe, bool active_only) {
  const std::string what = "parameters of a layer";
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, s.source, what); };
  auto add = [&](int64_t a, int64_t b) { return checked_add(a, b, s.source, what); };
  const int64_t H = s.hidden;
  const int64_t Q = mul(s.n_head, s.head_dim), KV = mul(s.n_kv_head, s.head_dim);
  int64_t n = mul(2, H);                                   // two norms
  n = add(n, add(mul(mul(2, H), Q), mul(mul(2, H), KV)));  // q, o; k, v
  if (s.qkv_bias) n = add(n, add(Q, mul(2, KV)));
  if (s.o_bias) n = add(n, H);
  if (s.qk_norm) n = add(n, s.qk_norm_full ? add(Q, KV) : mul(2, s.head_dim));
  if (s.sandwich_norm) n = add(n, mul(2, H));  // post-attention output norm, pre-feedforward norm
  if (moe) {
    const int64_t experts = active_only ? s.moe.top_k : s.moe.n_expert;
    n = add(n, mul(s.moe.n_expert, H));                            // router
    n = add(n, mul(experts, mul(3, mul(H, s.moe.intermediate))));  // gate, up, down of each expert
    return n;
  }
  const int64_t I = s.intermediate;
  n = add(n, mul(3, mul(H, I)));  // gate, up, down
  if (s.mlp_bias) n = add(n, add(mul(2, I), H));
  return n;
}

}  // namespace

int64_t ModelSpec::layer_params(int l) const {
  if (arch == Arch::Gemma4) return detail::gemma4_layer_params(*this, l, false);
  return count_layer_params(*this, moe_layer(l), false);
}

int64_t ModelSpec::layer_active_params(int l) const {
  if (arch == Arch::Gemma4) return detail::gemma4_layer_params(*this, l, true);
  return count_layer_params(*this, moe_layer(l), true);
}

int64_t ModelSpec::layer_params() const {
  int64_t n = 0;
  for (int l = 0; l < n_layer; ++l) n = std::max(n, layer_params(l));
  return n;
}

int64_t ModelSpec::total_params() const {
  const std::string what = "parameters of the model";
  const int64_t emb = checked_mul(vocab, hidden, source, what);
  int64_t n = checked_add(emb, hidden, source, what);
  for (int l = 0; l < n_layer; ++l) n = checked_add(n, layer_params(l), source, what);
  if (!tie_embeddings) n = checked_add(n, emb, source, what);
  if (arch == Arch::Gemma4) n = checked_add(n, detail::gemma4_model_params(*this), source, what);
  return n;
}

void ModelSpec::check_seq_len(int64_t seq_len, const std::string& where) const {
  if (sliding_window > 0 && sliding_window < seq_len) {
    input_error_naming(
        where, {"the model uses sliding-window attention (window " + std::to_string(sliding_window) + ") shorter than ",
                Setting::SeqLen, " " + std::to_string(seq_len) + "; sliding windows are not supported: use ",
                Setting::SeqLen, " <= " + std::to_string(sliding_window)});
  }
}

namespace {

// parse_model_spec without its refusal of Gemma 4 (read_gemma4_spec).
ModelSpec parse_spec(const json& cfg_in, const std::string& path) {
  if (!cfg_in.is_object()) input_error(path, "config must be a JSON object");
  // Gemma 3 / 4: the text model's config with the family's defaults filled in (spec_gemma{3,4}.cpp).
  json gemma = detail::gemma3_text_config(cfg_in, path);  // null unless a Gemma 3 config
  if (gemma.is_null()) gemma = detail::gemma4_text_config(cfg_in, path);  // null unless a Gemma 4 config
  const json& cfg = gemma.is_null() ? cfg_in : gemma;
  const JsonRef c(cfg, path);
  ModelSpec s;
  s.source = path;
  std::string mt = c.string_or("model_type", "");
  std::string arch;
  if (std::optional<JsonRef> a = c.get("architectures")) {
    if (a->size() > 0) arch = a->at(size_t(0)).as_string();
  }
  if (arch.empty()) {
    if (mt == "llama") arch = "LlamaForCausalLM";
    if (mt == "mistral") arch = "MistralForCausalLM";
    if (mt == "qwen2") arch = "Qwen2ForCausalLM";
    if (mt == "qwen3") arch = "Qwen3ForCausalLM";
    if (mt == "gemma3_text") arch = "Gemma3ForCausalLM";
    if (mt == "gemma3") arch = "Gemma3ForConditionalGeneration";
    if (mt == "qwen3_moe") arch = "Qwen3MoeForCausalLM";
    if (mt == "mixtral") arch = "MixtralForCausalLM";
    if (mt == "olmoe") arch = "OlmoeForCausalLM";
    if (mt == "gemma4_text") arch = "Gemma4ForCausalLM";
    if (mt == "gemma4") arch = "Gemma4ForConditionalGeneration";
  }
  if (arch == "LlamaForCausalLM") {
    s.arch = Arch::Llama;
  } else if (arch == "MistralForCausalLM") {
    s.arch = Arch::Mistral;
  } else if (arch == "Qwen2ForCausalLM") {
    s.arch = Arch::Qwen2;
  } else if (arch == "Qwen3ForCausalLM") {
    s.arch = Arch::Qwen3;
  } else if (arch == "Gemma3ForCausalLM" || arch == "Gemma3ForConditionalGeneration") {
    s.arch = Arch::Gemma3;
  } else if (arch == "Qwen3MoeForCausalLM") {
    s.arch = Arch::Qwen3Moe;
  } else if (arch == "MixtralForCausalLM") {
    s.arch = Arch::Mixtral;
  } else if (arch == "OlmoeForCausalLM") {
    s.arch = Arch::Olmoe;
  } else if (arch == "Gemma4ForCausalLM" || arch == "Gemma4ForConditionalGeneration") {
    s.arch = Arch::Gemma4;  // read and checked; parse_model_spec refuses it after (docs/GEMMA4.md)
  } else {
    input_error(path, "unsupported architecture '" + (arch.empty() ? mt : arch) +
                          "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                          "Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Qwen3MoeForCausalLM, MixtralForCausalLM, "
                          "OlmoeForCausalLM)");
  }
  s.architecture = arch;
  s.model_type = mt.empty() ? std::string(s.arch == Arch::Llama      ? "llama"
                                          : s.arch == Arch::Mistral  ? "mistral"
                                          : s.arch == Arch::Qwen2    ? "qwen2"
                                          : s.arch == Arch::Qwen3    ? "qwen3"
                                          : s.arch == Arch::Qwen3Moe ? "qwen3_moe"
                                          : s.arch == Arch::Mixtral  ? "mixtral"
                                          : s.arch == Arch::Olmoe    ? "olmoe"
                                          : s.arch == Arch::Gemma4   ? "gemma4_text"
                                                                     : "gemma3_text")
                            : mt;

  // Every dimension is read as int64 and bounded before it is narrowed or multiplied.
  s.vocab = c.at("vocab_size").as_int(1, L::kMaxVocab);
  s.hidden = c.at("hidden_size").as_int(1, L::kMaxHidden);
  s.intermediate = c.at("intermediate_size").as_int(1, L::kMaxIntermediate);
  s.n_layer = int(c.at("num_hidden_layers").as_int(1, L::kMaxLayers));
  s.n_head = int(c.at("num_attention_heads").as_int(1, L::kMaxHeads));
  s.n_kv_head = int(c.int_or("num_key_value_heads", s.n_head, 1, L::kMaxHeads));
  if (s.n_head % s.n_kv_head != 0) {
    input_error(path, "num_attention_heads (" + std::to_string(s.n_head) +
                          ") is not a multiple of num_key_value_heads (" + std::to_string(s.n_kv_head) + ")");
  }
  int64_t hd = c.int_or("head_dim", 0, 0, L::kMaxHeadDim);
  if (hd == 0) {
    if (s.hidden % s.n_head != 0)
      input_error(path, "hidden_size is not a multiple of num_attention_heads and no head_dim");
    hd = s.hidden / s.n_head;
  }
  if (hd <= 0 || hd % 2 != 0) input_error(path, "head_dim must be positive and even, got " + std::to_string(hd));
  s.head_dim = int(hd);
  s.rms_eps = c.number_or("rms_norm_eps", 1e-6, 0, 1);
  s.max_position = c.int_or("max_position_embeddings", 0, 0, L::kMaxPositions);
  s.initializer_range = c.number_or("initializer_range", 0.02, 0, 100);
  s.tie_embeddings = c.bool_or("tie_word_embeddings", false);
  // Gemma3TextConfig's default is 0, every other family's none. As torch takes padding_idx: a
  // negative id counts from the end (LLaMA-1 configs' -1); outside the vocabulary (or null) none.
  if (cfg.contains("pad_token_id") && cfg["pad_token_id"].is_number_integer()) {
    int64_t pad = cfg["pad_token_id"].get<int64_t>();
    if (pad < 0 && pad >= -s.vocab) pad += s.vocab;
    s.pad_token_id = pad >= 0 && pad < s.vocab ? pad : -1;
  } else if (!cfg.contains("pad_token_id") && s.arch == Arch::Gemma3) {
    s.pad_token_id = 0;
  }
  std::string act = c.string_or("hidden_act", "silu");
  if (s.arch != Arch::Gemma3 && s.arch != Arch::Gemma4 && act != "silu" && act != "swish")
    input_error(path, "hidden_act '" + act + "' is not supported (only silu)");
  if (c.has("torch_dtype") && cfg["torch_dtype"].is_string()) s.torch_dtype = cfg["torch_dtype"];
  if (c.has("dtype") && cfg["dtype"].is_string()) s.torch_dtype = cfg["dtype"];

  bool attention_bias = c.bool_or("attention_bias", false);
  switch (s.arch) {
    case Arch::Qwen2:
      s.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o bias
      break;
    case Arch::Qwen3:
    case Arch::Qwen3Moe:
      s.qk_norm = true;
      s.qkv_bias = s.o_bias = attention_bias;
      break;
    case Arch::Olmoe:  // q_norm / k_norm over the whole q and k projections
      s.qk_norm = s.qk_norm_full = true;
      s.qkv_bias = s.o_bias = attention_bias;
      if (c.has("clip_qkv")) input_error(path, "clip_qkv is not supported (OLMoE checkpoints leave it null)");
      if (s.head_dim * s.n_head != s.hidden)
        input_error(path, "OLMoE needs head_dim * num_attention_heads == hidden_size");
      break;
    case Arch::Mixtral:
      break;
    case Arch::Llama:
      s.qkv_bias = s.o_bias = attention_bias;
      s.mlp_bias = c.bool_or("mlp_bias", false);
      break;
    case Arch::Mistral:
    case Arch::Gemma3:  // detail::apply_gemma3 below
    case Arch::Gemma4:  // detail::apply_gemma4 below
      break;
  }

  // Sliding-window attention: Mistral applies it whenever sliding_window is set; Qwen2/3 only
  // with use_sliding_window (and then from layer max_window_layers on). Only compared, never sized
  // from: any int64 (<= 0 = none).
  constexpr int64_t kAny = std::numeric_limits<int64_t>::max();
  int64_t window = c.int_or("sliding_window", 0, -kAny, kAny);
  if (s.arch == Arch::Mistral || s.arch == Arch::Mixtral) {
    s.sliding_window = window;
  } else if (s.arch == Arch::Qwen2 || s.arch == Arch::Qwen3 || s.arch == Arch::Qwen3Moe) {
    bool use = c.bool_or("use_sliding_window", false);
    int64_t max_window_layers = c.int_or("max_window_layers", s.n_layer, -kAny, kAny);
    if (use && max_window_layers < s.n_layer) s.sliding_window = window;
    if (c.has("layer_types") && cfg["layer_types"].is_array()) {  // transformers v5 spelling
      for (const auto& t : cfg["layer_types"]) {
        if (t.is_string() && t.get<std::string>() == "sliding_attention") s.sliding_window = window;
      }
    }
  } else if (window > 0) {
    s.sliding_window = window;
  }
  detail::parse_rope(c, s);
  if (s.arch == Arch::Gemma3) detail::apply_gemma3(c, s);
  if (s.arch == Arch::Gemma4) detail::apply_gemma4(c, s);
  parse_moe(c, s);
  s.total_params();  // every size computed from the spec fits int64 (checked; throws naming the file)
  return s;
}

}  // namespace

ModelSpec parse_model_spec(const json& cfg, const std::string& path) {
  ModelSpec s = parse_spec(cfg, path);
  if (s.arch == Arch::Gemma4) {
    // Read and checked in full, so that a bad config is named first; a part read that cannot train
    // yet (gemma4_missing: none today) is refused naming its key (docs/GEMMA4.md).
    const std::string missing = detail::gemma4_missing(s);
    if (!missing.empty())
      input_error(path, "Gemma 4 ('" + s.architecture + "') with " + missing +
                            " is not supported yet (docs/GEMMA4.md)");
  }
  return s;
}

ModelSpec read_gemma4_spec(const json& cfg, const std::string& path) {
  ModelSpec s = parse_spec(cfg, path);
  if (s.arch != Arch::Gemma4) input_error(path, "not a Gemma 4 config ('" + s.architecture + "')");
  return s;
}

ModelSpec load_model_spec(const std::string& config_path) {
  return parse_model_spec(read_json_file(config_path, {kJsonMaxDepth, kConfigMaxFileBytes}), config_path);
}

}  // namespace sf
