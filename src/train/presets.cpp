#include "train/presets.h"

#include "core/error.h"

namespace sf {

namespace {

// A decoder's published shape (the model's config.json on the Hugging Face hub).
struct Shape {
  const char* name;
  int hidden, intermediate, layers, heads, kv_heads;
  int head_dim;  // 0: hidden / heads
  bool tied;
};

nlohmann::json with_shape(nlohmann::json cfg, const Shape& l) {
  cfg.update({{"hidden_size", l.hidden},
              {"intermediate_size", l.intermediate},
              {"num_hidden_layers", l.layers},
              {"num_attention_heads", l.heads},
              {"num_key_value_heads", l.kv_heads},
              {"tie_word_embeddings", l.tied}});
  if (l.head_dim > 0) cfg["head_dim"] = l.head_dim;
  return cfg;
}

nlohmann::json llama3_base() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 128256},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},
          {"max_position_embeddings", 131072},
          {"hidden_act", "silu"},
          {"torch_dtype", "bfloat16"},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 32.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}}}};
}

nlohmann::json mistral_base(int vocab, double rope_theta, int max_positions) {
  return {{"architectures", {"MistralForCausalLM"}},
          {"model_type", "mistral"},
          {"vocab_size", vocab},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", rope_theta},
          {"max_position_embeddings", max_positions},
          {"sliding_window", nullptr},
          {"hidden_act", "silu"},
          {"torch_dtype", "bfloat16"}};
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"llama-1b",   "llama-3b",    "llama-8b",     "llama-13b",
                                                 "llama-70b",  "mistral-24b", "mistral-123b", "qwen2.5-7b", "gemma3-4b",
                                                 "qwen3-30b-a3b", "mixtral-8x7b", "olmoe-1b-7b"};
  return names;
}

nlohmann::json preset_config(const std::string& name) {
  // Llama 3.2 1B and 3B, Llama 3.1 8B, Llama 3 70B (Llama 3.1 70B has the same shapes; its rope
  // scaling is taken here, as for the 8B).
  for (const Shape& l : {Shape{"llama-1b", 2048, 8192, 16, 32, 8, 0, true}, Shape{"llama-3b", 3072, 8192, 28, 24, 8, 0, true},
                         Shape{"llama-8b", 4096, 14336, 32, 32, 8, 0, false},
                         Shape{"llama-70b", 8192, 28672, 80, 64, 8, 0, false}})
    if (name == l.name) return with_shape(llama3_base(), l);
  if (name == "llama-13b") {  // Llama 2 13B: multi-head attention, 32k vocabulary, 4k context, theta 1e4
    return with_shape({{"architectures", {"LlamaForCausalLM"}},
                       {"model_type", "llama"},
                       {"vocab_size", 32000},
                       {"rms_norm_eps", 1e-5},
                       {"rope_theta", 10000.0},
                       {"max_position_embeddings", 4096},
                       {"hidden_act", "silu"},
                       {"torch_dtype", "bfloat16"}},
                      Shape{"llama-13b", 5120, 13824, 40, 40, 40, 0, false});
  }
  // Mistral Small 24B (2501): 32 heads of 128 on a 5120 residual; Mistral Large 2 (2407), 123B.
  if (name == "mistral-24b")
    return with_shape(mistral_base(131072, 100000000.0, 32768), Shape{"mistral-24b", 5120, 32768, 40, 32, 8, 128, false});
  if (name == "mistral-123b")
    return with_shape(mistral_base(32768, 1000000.0, 131072),
                      Shape{"mistral-123b", 12288, 28672, 88, 96, 8, 128, false});
  if (name == "qwen2.5-7b") {
    return {{"architectures", {"Qwen2ForCausalLM"}},
            {"model_type", "qwen2"},
            {"vocab_size", 152064},
            {"hidden_size", 3584},
            {"intermediate_size", 18944},
            {"num_hidden_layers", 28},
            {"num_attention_heads", 28},
            {"num_key_value_heads", 4},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"max_position_embeddings", 32768},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  }
  if (name == "gemma3-4b") {
    // google/gemma-3-4b-pt's text_config (the rest are Gemma3TextConfig's defaults, written out):
    // 34 layers, every 6th global (rope_theta 1e6 with linear scaling 8), the others local with a
    // window of 1024 (rope base 1e4); head_dim 256, query_pre_attn_scalar 256, tied embeddings.
    return {{"architectures", {"Gemma3ForCausalLM"}},
            {"model_type", "gemma3_text"},
            {"vocab_size", 262208},
            {"hidden_size", 2560},
            {"intermediate_size", 10240},
            {"num_hidden_layers", 34},
            {"num_attention_heads", 8},
            {"num_key_value_heads", 4},
            {"head_dim", 256},
            {"query_pre_attn_scalar", 256},
            {"hidden_activation", "gelu_pytorch_tanh"},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"rope_local_base_freq", 10000.0},
            {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}},
            {"sliding_window", 1024},
            {"sliding_window_pattern", 6},
            {"max_position_embeddings", 131072},
            {"tie_word_embeddings", true},
            {"torch_dtype", "bfloat16"}};
  }
  // Mixture of experts: the published configs' shapes (Hugging Face Qwen/Qwen3-30B-A3B,
  // mistralai/Mixtral-8x7B-v0.1, allenai/OLMoE-1B-7B-0924).
  if (name == "qwen3-30b-a3b") {
    return {{"architectures", {"Qwen3MoeForCausalLM"}},
            {"model_type", "qwen3_moe"},
            {"vocab_size", 151936},
            {"hidden_size", 2048},
            {"intermediate_size", 6144},
            {"moe_intermediate_size", 768},
            {"num_hidden_layers", 48},
            {"num_attention_heads", 32},
            {"num_key_value_heads", 4},
            {"head_dim", 128},
            {"num_experts", 128},
            {"num_experts_per_tok", 8},
            {"norm_topk_prob", true},
            {"decoder_sparse_step", 1},
            {"mlp_only_layers", nlohmann::json::array()},
            {"output_router_logits", false},
            {"router_aux_loss_coef", 0.001},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"max_position_embeddings", 40960},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  }
  if (name == "mixtral-8x7b") {
    return {{"architectures", {"MixtralForCausalLM"}},
            {"model_type", "mixtral"},
            {"vocab_size", 32000},
            {"hidden_size", 4096},
            {"intermediate_size", 14336},
            {"num_hidden_layers", 32},
            {"num_attention_heads", 32},
            {"num_key_value_heads", 8},
            {"num_local_experts", 8},
            {"num_experts_per_tok", 2},
            {"output_router_logits", false},
            {"router_aux_loss_coef", 0.02},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 1000000.0},
            {"max_position_embeddings", 32768},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  }
  if (name == "olmoe-1b-7b") {
    return {{"architectures", {"OlmoeForCausalLM"}},
            {"model_type", "olmoe"},
            {"vocab_size", 50304},
            {"hidden_size", 2048},
            {"intermediate_size", 1024},
            {"num_hidden_layers", 16},
            {"num_attention_heads", 16},
            {"num_key_value_heads", 16},
            {"num_experts", 64},
            {"num_experts_per_tok", 8},
            {"norm_topk_prob", false},
            {"output_router_logits", false},
            {"router_aux_loss_coef", 0.01},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},
            {"max_position_embeddings", 4096},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  }
  std::string names;
  for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  input_error("--preset", "unknown preset '" + name + "' (" + names + ")");
}

}  // namespace sf
