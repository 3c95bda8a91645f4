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
  input_error("--preset", "unknown preset '" + name + "' (llama-1b, llama-3b, llama-8b, qwen2.5-7b, gemma3-4b)");
}

}  // namespace sf
