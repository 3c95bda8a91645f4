#include "model/spec.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"

namespace sf {
namespace {

using json = nlohmann::json;

// Typed optional access: absent or null -> fallback; wrong type -> InputError.
double get_num(const json& c, const char* key, double fallback, const std::string& path) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_number()) input_error(path, std::string("'") + key + "' must be a number");
  return it->get<double>();
}
int64_t get_int(const json& c, const char* key, int64_t fallback, const std::string& path) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() && !(it->is_number() && it->get<double>() == double(int64_t(it->get<double>())))) {
    input_error(path, std::string("'") + key + "' must be an integer");
  }
  return it->get<int64_t>();
}
int64_t need_int(const json& c, const char* key, const std::string& path) {
  if (!c.contains(key) || c[key].is_null()) input_error(path, std::string("missing '") + key + "'");
  int64_t v = get_int(c, key, 0, path);
  if (v <= 0) input_error(path, std::string("'") + key + "' must be positive, got " + std::to_string(v));
  return v;
}
bool get_bool(const json& c, const char* key, bool fallback, const std::string& path) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) input_error(path, std::string("'") + key + "' must be true or false");
  return it->get<bool>();
}

void parse_rope(const json& c, ModelSpec& s, const std::string& path) {
  // transformers v5 keeps everything in rope_parameters; older configs use rope_theta + rope_scaling.
  json rp;
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    rp = c["rope_parameters"];
  } else if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    rp = c["rope_scaling"];
  } else if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    input_error(path, "'rope_scaling' must be an object or null");
  }
  s.rope.theta = get_num(c, "rope_theta", 10000.0, path);
  if (rp.is_object()) {
    s.rope.theta = get_num(rp, "rope_theta", s.rope.theta, path);
    std::string type = "default";
    if (rp.contains("rope_type") && rp["rope_type"].is_string()) {
      type = rp["rope_type"].get<std::string>();
    } else if (rp.contains("type") && rp["type"].is_string()) {  // legacy alias
      type = rp["type"].get<std::string>();
    }
    if (type != "default" && type != "linear" && type != "llama3") {
      input_error(path, "rope scaling type '" + type + "' is not supported (supported: default, linear, llama3)");
    }
    s.rope.type = type;
    if (type != "default") {
      s.rope.factor = get_num(rp, "factor", 0.0, path);
      if (!(s.rope.factor > 0)) input_error(path, "rope scaling '" + type + "' needs a positive 'factor'");
    }
    if (type == "llama3") {
      s.rope.low_freq_factor = get_num(rp, "low_freq_factor", 1.0, path);
      s.rope.high_freq_factor = get_num(rp, "high_freq_factor", 4.0, path);
      s.rope.original_max_position = get_int(rp, "original_max_position_embeddings", 8192, path);
      if (!(s.rope.high_freq_factor > s.rope.low_freq_factor)) {
        input_error(path, "llama3 rope scaling needs high_freq_factor > low_freq_factor");
      }
    }
  }
  if (!(s.rope.theta > 0)) input_error(path, "'rope_theta' must be positive");
}

}  // namespace

int64_t ModelSpec::layer_params() const {
  int64_t H = hidden, Q = q_dim(), KV = kv_dim(), I = intermediate;
  int64_t n = 2 * H;                // two norms
  n += H * Q + 2 * H * KV + Q * H;  // q, k, v, o
  if (qkv_bias) n += Q + 2 * KV;
  if (o_bias) n += H;
  if (qk_norm) n += 2 * head_dim;
  n += 3 * H * I;  // gate, up, down
  if (mlp_bias) n += 2 * I + H;
  return n;
}

int64_t ModelSpec::total_params() const {
  int64_t n = vocab * hidden + hidden + int64_t(n_layer) * layer_params();
  if (!tie_embeddings) n += vocab * hidden;
  return n;
}

void ModelSpec::check_seq_len(int64_t seq_len, const std::string& where) const {
  if (sliding_window > 0 && sliding_window < seq_len) {
    input_error(where, "the model uses sliding-window attention (window " + std::to_string(sliding_window) +
                           ") shorter than --seq-len " + std::to_string(seq_len) +
                           "; sliding windows are not supported: use --seq-len <= " + std::to_string(sliding_window));
  }
}

ModelSpec parse_model_spec(const json& c, const std::string& path) {
  if (!c.is_object()) input_error(path, "config must be a JSON object");
  ModelSpec s;
  std::string mt = c.value("model_type", std::string());
  std::string arch;
  if (c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty() &&
      c["architectures"][0].is_string()) {
    arch = c["architectures"][0].get<std::string>();
  }
  if (arch.empty()) {
    if (mt == "llama") arch = "LlamaForCausalLM";
    if (mt == "mistral") arch = "MistralForCausalLM";
    if (mt == "qwen2") arch = "Qwen2ForCausalLM";
    if (mt == "qwen3") arch = "Qwen3ForCausalLM";
  }
  if (arch == "LlamaForCausalLM") {
    s.arch = Arch::Llama;
  } else if (arch == "MistralForCausalLM") {
    s.arch = Arch::Mistral;
  } else if (arch == "Qwen2ForCausalLM") {
    s.arch = Arch::Qwen2;
  } else if (arch == "Qwen3ForCausalLM") {
    s.arch = Arch::Qwen3;
  } else {
    input_error(path, "unsupported architecture '" + (arch.empty() ? mt : arch) +
                          "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
  }
  s.architecture = arch;
  s.model_type = mt.empty() ? std::string(s.arch == Arch::Llama     ? "llama"
                                          : s.arch == Arch::Mistral ? "mistral"
                                          : s.arch == Arch::Qwen2   ? "qwen2"
                                                                    : "qwen3")
                            : mt;

  s.vocab = need_int(c, "vocab_size", path);
  s.hidden = need_int(c, "hidden_size", path);
  s.intermediate = need_int(c, "intermediate_size", path);
  s.n_layer = int(need_int(c, "num_hidden_layers", path));
  s.n_head = int(need_int(c, "num_attention_heads", path));
  s.n_kv_head = int(get_int(c, "num_key_value_heads", s.n_head, path));
  if (s.n_kv_head <= 0) input_error(path, "'num_key_value_heads' must be positive");
  if (s.n_head % s.n_kv_head != 0) {
    input_error(path, "num_attention_heads (" + std::to_string(s.n_head) +
                          ") is not a multiple of num_key_value_heads (" + std::to_string(s.n_kv_head) + ")");
  }
  int64_t hd = get_int(c, "head_dim", 0, path);
  if (hd == 0) {
    if (s.hidden % s.n_head != 0)
      input_error(path, "hidden_size is not a multiple of num_attention_heads and no head_dim");
    hd = s.hidden / s.n_head;
  }
  if (hd <= 0 || hd % 2 != 0) input_error(path, "head_dim must be positive and even, got " + std::to_string(hd));
  s.head_dim = int(hd);
  s.rms_eps = get_num(c, "rms_norm_eps", 1e-6, path);
  s.max_position = get_int(c, "max_position_embeddings", 0, path);
  s.initializer_range = get_num(c, "initializer_range", 0.02, path);
  s.tie_embeddings = get_bool(c, "tie_word_embeddings", false, path);
  std::string act = c.value("hidden_act", std::string("silu"));
  if (c.contains("hidden_act") && !c["hidden_act"].is_string()) input_error(path, "'hidden_act' must be a string");
  if (act != "silu" && act != "swish") input_error(path, "hidden_act '" + act + "' is not supported (only silu)");
  if (c.contains("torch_dtype") && c["torch_dtype"].is_string()) s.torch_dtype = c["torch_dtype"];
  if (c.contains("dtype") && c["dtype"].is_string()) s.torch_dtype = c["dtype"];

  bool attention_bias = get_bool(c, "attention_bias", false, path);
  switch (s.arch) {
    case Arch::Qwen2:
      s.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o bias
      break;
    case Arch::Qwen3:
      s.qk_norm = true;
      s.qkv_bias = s.o_bias = attention_bias;
      break;
    case Arch::Llama:
      s.qkv_bias = s.o_bias = attention_bias;
      s.mlp_bias = get_bool(c, "mlp_bias", false, path);
      break;
    case Arch::Mistral:
      break;
  }

  // Sliding-window attention: Mistral applies it whenever sliding_window is set; Qwen2/3 only
  // with use_sliding_window (and then from layer max_window_layers on).
  int64_t window = get_int(c, "sliding_window", 0, path);
  if (s.arch == Arch::Mistral) {
    s.sliding_window = window;
  } else if (s.arch == Arch::Qwen2 || s.arch == Arch::Qwen3) {
    bool use = get_bool(c, "use_sliding_window", false, path);
    int64_t max_window_layers = get_int(c, "max_window_layers", s.n_layer, path);
    if (use && max_window_layers < s.n_layer) s.sliding_window = window;
    if (c.contains("layer_types") && c["layer_types"].is_array()) {  // transformers v5 spelling
      for (const auto& t : c["layer_types"]) {
        if (t.is_string() && t.get<std::string>() == "sliding_attention") s.sliding_window = window;
      }
    }
  } else if (window > 0) {
    s.sliding_window = window;
  }
  parse_rope(c, s, path);
  return s;
}

ModelSpec load_model_spec(const std::string& config_path) {
  return parse_model_spec(read_json_file(config_path), config_path);
}

}  // namespace sf
