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
  input_error("--preset", "unknown preset '" + name + "' (llama-1b, llama-3b, llama-8b, qwen2.5-7b)");
}

}  // namespace sf
