// Shared by the Gemma 4 cpu tests: a tiny gemma4_text config.
#pragma once
#include <nlohmann/json.hpp>

namespace sf::test {

// Layer types of n layers as Gemma4TextConfig's default: every sixth global, and the last.
inline nlohmann::json gemma4_layer_types(int n) {
  nlohmann::json t = nlohmann::json::array();
  for (int i = 0; i < n; ++i) t.push_back((i + 1) % 6 == 0 || i == n - 1 ? "full_attention" : "sliding_attention");
  return t;
}

// 6 layers (5 local, window 4, then a global one), H 32, 4 heads of 8 (global: 16, one KV head,
// k = v), no per-layer inputs.
inline nlohmann::json gemma4_tiny_config() {
  return nlohmann::json{{"model_type", "gemma4_text"},
                        {"vocab_size", 64},
                        {"hidden_size", 32},
                        {"intermediate_size", 48},
                        {"num_hidden_layers", 6},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"num_global_key_value_heads", 1},
                        {"head_dim", 8},
                        {"global_head_dim", 16},
                        {"attention_k_eq_v", true},
                        {"hidden_size_per_layer_input", 0},
                        {"sliding_window", 4},
                        {"layer_types", gemma4_layer_types(6)}};
}

}  // namespace sf::test
