// Tiny model configurations of each supported architecture, for model-level and CLI tests.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sf::test {

// A tiny config of the given family exercising its special features:
// llama: GQA, untied, attention_bias, llama3 rope scaling; mistral: MHA, tied;
// qwen2: q/k/v biases, GQA; qwen3: q/k-norm, head_dim != hidden/heads, v5 rope_parameters;
// gemma3: local/global layers, window 4, (1 + w) norms, GeGLU, embedding scale.
// mixture of experts: qwen3_moe, mixtral, olmoe (see each); gemma4_ple: Gemma 4 with per-layer inputs;
// gemma4_moe: and the MoE block.
inline nlohmann::json tiny_config(const std::string& family) {
  nlohmann::json c = {{"vocab_size", 37},         {"hidden_size", 32},        {"intermediate_size", 48},
                      {"num_hidden_layers", 2},   {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"rms_norm_eps", 1e-5},     {"rope_theta", 10000.0},    {"max_position_embeddings", 64},
                      {"initializer_range", 0.2}, {"hidden_act", "silu"},     {"torch_dtype", "float32"}};
  if (family == "llama") {
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["attention_bias"] = true;
    c["tie_word_embeddings"] = false;
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 16}};
  } else if (family == "mistral") {
    c["architectures"] = {"MistralForCausalLM"};
    c["model_type"] = "mistral";
    c["num_key_value_heads"] = 4;
    c["tie_word_embeddings"] = true;
    c["sliding_window"] = nullptr;
  } else if (family == "qwen2") {
    c["architectures"] = {"Qwen2ForCausalLM"};
    c["model_type"] = "qwen2";
    c["tie_word_embeddings"] = false;
    c["use_sliding_window"] = false;
    c["sliding_window"] = 32;
  } else if (family == "qwen3") {
    c["architectures"] = {"Qwen3ForCausalLM"};
    c["model_type"] = "qwen3";
    c["head_dim"] = 16;  // != 32 / 4
    c["tie_word_embeddings"] = true;
    c.erase("rope_theta");
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  } else if (family == "gemma3") {
    // Local and global layers (pattern 2 over 3 layers: local, global, local) with a window of 4,
    // shorter than the tests' sequences; linear rope scaling on the global layers, another base
    // on the local ones; a query_pre_attn_scalar that is not head_dim; tied embeddings.
    c["architectures"] = {"Gemma3ForCausalLM"};
    c["model_type"] = "gemma3_text";
    c.erase("hidden_act");
    c["hidden_activation"] = "gelu_pytorch_tanh";
    c["num_hidden_layers"] = 3;
    c["head_dim"] = 16;
    c["query_pre_attn_scalar"] = 12;
    c["sliding_window"] = 4;
    c["sliding_window_pattern"] = 2;
    c["rope_local_base_freq"] = 100.0;
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
    c["final_logit_softcapping"] = nullptr;
    c["attn_logit_softcapping"] = nullptr;
    c["tie_word_embeddings"] = true;
  } else if (family == "gemma4_ple" || family == "gemma4_moe") {  // per-layer inputs, K/V shared by the last
    // two layers; gemma4_moe: and the MoE block beside every dense MLP, all 3 experts (k = E: no routing choice for a
    // finite difference to flip; tests/test_gemma4_moe.cpp covers top 2 of 5) (not in families())
    c = {{"architectures", {"Gemma4ForCausalLM"}}, {"model_type", "gemma4_text"}, {"vocab_size", 37},
         {"hidden_size", 32}, {"intermediate_size", 24}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
         {"num_key_value_heads", 2}, {"num_global_key_value_heads", 1}, {"head_dim", 8}, {"global_head_dim", 16},
         {"attention_k_eq_v", true}, {"hidden_size_per_layer_input", 4}, {"vocab_size_per_layer_input", 37},
         {"num_kv_shared_layers", 2}, {"use_double_wide_mlp", true}, {"final_logit_softcapping", 5.0},
         {"sliding_window", 4},
         {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}},
         {"rope_parameters",
          {{"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e6}}},
           {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}}},
         {"max_position_embeddings", 64}, {"rms_norm_eps", 1e-6}, {"initializer_range", 0.2},
         {"tie_word_embeddings", true}, {"pad_token_id", 0}, {"torch_dtype", "float32"}};
    if (family == "gemma4_moe") {
      c["enable_moe_block"] = true;
      c["num_experts"] = 3;
      c["top_k_experts"] = 3;
      c["moe_intermediate_size"] = 12;
    }
  } else if (family == "qwen3_moe") {  // per-head q/k-norm, renormalised top-k, a dense layer, aux loss
    c["architectures"] = {"Qwen3MoeForCausalLM"};
    c["model_type"] = "qwen3_moe";
    c["num_hidden_layers"] = 3;
    c["head_dim"] = 16;
    c["tie_word_embeddings"] = false;
    c["num_experts"] = 5;
    c["num_experts_per_tok"] = 2;
    c["moe_intermediate_size"] = 24;
    c["norm_topk_prob"] = true;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = {1};
    c["output_router_logits"] = true;
    c["router_aux_loss_coef"] = 0.05;
  } else if (family == "mixtral") {  // w1/w2/w3 names, always renormalised, aux loss
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["tie_word_embeddings"] = false;
    c["num_local_experts"] = 4;
    c["num_experts_per_tok"] = 2;
    c["intermediate_size"] = 20;
    c["sliding_window"] = nullptr;
    c["output_router_logits"] = true;
    c["router_aux_loss_coef"] = 0.02;
  } else if (family == "olmoe") {  // q/k-norm over the whole projection, top-k not renormalised
    c["architectures"] = {"OlmoeForCausalLM"};
    c["model_type"] = "olmoe";
    c["tie_word_embeddings"] = false;
    c["num_experts"] = 6;
    c["num_experts_per_tok"] = 3;
    c["intermediate_size"] = 16;
    c["norm_topk_prob"] = false;
    c["output_router_logits"] = false;
    c["clip_qkv"] = nullptr;
  }
  return c;
}

// The mixture-of-experts families (not in families(): a finite-difference step through a whole
// model can flip a top-k choice, so they have their own model-level checks, test_moe_model.cpp).
inline const std::vector<std::string>& moe_families() {
  static const std::vector<std::string> f = {"qwen3_moe", "mixtral", "olmoe"};
  return f;
}

inline const std::vector<std::string>& families() {
  static const std::vector<std::string> f = {"llama", "mistral", "qwen2", "qwen3", "gemma3"};
  return f;
}

}  // namespace sf::test
