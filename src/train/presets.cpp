#include "train/presets.h"

#include "core/error.h"

namespace sf {

nlohmann::json preset_config(const std::string& name) {
  nlohmann::json llama = {{"architectures", {"LlamaForCausalLM"}},
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
  // Llama 3.2 1B and 3B, Llama 3.1 8B: their shapes on the configuration above.
  struct Shape {
    const char* name;
    int hidden, intermediate, layers, heads;
    bool tied;
  };
  for (const Shape& l : {Shape{"llama-1b", 2048, 8192, 16, 32, true}, Shape{"llama-3b", 3072, 8192, 28, 24, true},
                         Shape{"llama-8b", 4096, 14336, 32, 32, false}}) {
    if (name != l.name) continue;
    llama.update({{"hidden_size", l.hidden},
                  {"intermediate_size", l.intermediate},
                  {"num_hidden_layers", l.layers},
                  {"num_attention_heads", l.heads},
                  {"num_key_value_heads", 8},
                  {"tie_word_embeddings", l.tied}});
    return llama;
  }
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
  input_error("--preset", "unknown preset '" + name +
                              "' (llama-1b, llama-3b, llama-8b, qwen2.5-7b, qwen3-30b-a3b, mixtral-8x7b, olmoe-1b-7b)");
}

}  // namespace sf
