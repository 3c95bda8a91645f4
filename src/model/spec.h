// ModelSpec: the architecture of a Llama-family checkpoint, read from HF config.json.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace sf {

enum class Arch {
  Llama,
  Mistral,
  Qwen2,
  Qwen3,
  Gemma3,  // gemma3_text, and the language model of gemma3 (multimodal) checkpoints
  Qwen3Moe,
  Mixtral,
  Olmoe,
  Gemma4,  // gemma4_text, and the language model of gemma4 checkpoints: dense models (docs/GEMMA4.md)
};

struct RopeSpec {
  std::string type = "default";  // default | linear | llama3
  double theta = 10000.0;
  double factor = 1.0;                                   // linear, llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position = 8192;                  // llama3
};

// Upper bounds of config.json values, checked before anything is sized from them. Generous: the
// largest Llama-family models are far below (Llama 3.1 405B: 126 layers, 128 heads, hidden 16384,
// intermediate 53248, vocab 128256), and every size computed from values within them fits int64.
struct SpecLimits {
  static constexpr int64_t kMaxLayers = 1024;
  static constexpr int64_t kMaxHeads = 1024;
  static constexpr int64_t kMaxHidden = 65536;
  static constexpr int64_t kMaxIntermediate = int64_t(1) << 20;
  static constexpr int64_t kMaxVocab = int64_t(1) << 24;
  static constexpr int64_t kMaxHeadDim = 4096;
  static constexpr int64_t kMaxPositions = int64_t(1) << 26;
  static constexpr int64_t kMaxExperts = 4096;  // Qwen3-235B: 128, DeepSeek-V3: 256
};

// Mixture-of-experts decoder layers (qwen3_moe, mixtral, olmoe): a router picks top_k of n_expert
// SwiGLU experts per token. None of the three families has shared experts.
struct MoeSpec {
  int n_expert = 0;  // 0: the model is dense
  int top_k = 0;
  int64_t intermediate = 0;    // each expert's intermediate size
  bool norm_topk = false;      // renormalise the top-k probabilities to sum 1 (mixtral: always)
  bool mixtral_names = false;  // block_sparse_moe.{gate, experts.N.w1/w2/w3} instead of mlp.{gate, experts.N.*_proj}
  // The checkpoint keeps transformers v5's fused experts (save_original_format=False): mlp.gate,
  // mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I] in every family. Not a
  // config.json field: set from the checkpoint's names (adopt_checkpoint_names); loaded and saved
  // back in that layout (model/layout.h StoredTensor).
  bool fused_experts = false;
  std::vector<char> is_moe;    // [n_layer]: 1 where the layer's MLP is the MoE block (qwen3_moe has dense ones)
  bool aux_loss = false;       // output_router_logits: add router_aux_coef * load-balancing loss to the loss
  double aux_coef = 0.0;       // router_aux_loss_coef
  int moe_layers() const;      // layers with is_moe
};

// Gemma 4 text models (Arch::Gemma4; docs/GEMMA4.md): what differs from Gemma 3 per layer and
// per model. Global (full-attention) layers have their own head dim and KV-head count.
struct Gemma4Spec {
  std::vector<int> head_dim;  // [n_layer] global_head_dim on full-attention layers, head_dim on local ones
  std::vector<int> kv_heads;  // [n_layer] num_global_key_value_heads on global layers with k_eq_v
  bool k_eq_v = false;        // attention_k_eq_v: global layers have no v_proj, V = v_norm(k_proj(x))
  // Global layers' RoPE ("proportional"): the first int(fraction * head_dim / 2) frequency pairs
  // rotate with theta^(-2i / head_dim), the rest have frequency 0 (unrotated). rope_type "default"
  // on global layers: fraction 1.
  double global_rope_fraction = 1.0;
  int n_kv_shared = 0;         // num_kv_shared_layers: the last layers reuse earlier layers' K/V
  std::vector<int> kv_source;  // [n_layer] the layer whose K/V layer l attends to (l itself unless shared)
  int64_t ple_dim = 0;         // hidden_size_per_layer_input: per-layer input embeddings (0: none)
  int64_t ple_vocab = 0;       // vocab_size_per_layer_input
  bool double_wide_mlp = false;  // use_double_wide_mlp: KV-shared layers' MLP is 2x intermediate
  double final_softcap = 0;      // final_logit_softcapping: logits = c tanh(logits / c); 0: none
  // enable_moe_block (26B-A4B): a routed GeGLU expert block beside the dense MLP in every layer.
  bool moe_block = false;
  int n_expert = 0, top_k = 0;
  int64_t moe_intermediate = 0;
  bool kv_shared(int l) const { return l >= int(kv_source.size()) ? false : kv_source[size_t(l)] != l; }
  int64_t mlp_intermediate(int l, int64_t intermediate) const;  // 2x on KV-shared layers with double_wide_mlp
  // [n_layer] each layer's layer_scalar (a checkpoint buffer, not a parameter: not trained; the
  // layer's output is multiplied by it). Not a config.json field: 1 until adopt_checkpoint_names
  // reads the checkpoint's layers.N.layer_scalar; save_hf_model writes them back.
  std::vector<float> layer_scalar;
};

struct ModelSpec {
  std::string source;  // the config's path (or "preset ..."), named by errors of sizes computed from it
  Arch arch = Arch::Llama;
  std::string architecture;  // as in config.json, e.g. "LlamaForCausalLM"
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3"
  int64_t vocab = 0, hidden = 0, intermediate = 0;
  int n_layer = 0, n_head = 0, n_kv_head = 0, head_dim = 0;
  double rms_eps = 1e-6;
  bool tie_embeddings = false;
  // pad_token_id: transformers builds the embedding as nn.Embedding(padding_idx=pad_token_id), whose
  // lookup gives that row no gradient (a tied head's gradient still reaches it). -1: none.
  int64_t pad_token_id = -1;
  bool qkv_bias = false;      // Qwen2 always; Llama/Qwen3/Mistral attention_bias
  bool o_bias = false;        // Llama/Qwen3 attention_bias
  bool mlp_bias = false;      // Llama mlp_bias
  bool qk_norm = false;       // Qwen3: RMSNorm over head_dim of q and k, before RoPE
  bool qk_norm_full = false;  // OLMoE (with qk_norm): the norm spans the whole projection, weights [Q], [KV]
  RopeSpec rope;
  int64_t max_position = 0;
  int64_t sliding_window = 0;  // 0 = none active
  double initializer_range = 0.02;
  std::string torch_dtype;  // "bfloat16", "float32", ... as written (may be empty)

  // Gemma 3 (Arch::Gemma3; the defaults below are every other family's behaviour).
  // HF tensor names start with this ("language_model.model." in gemma3 multimodal checkpoints).
  std::string tensor_prefix = "model.";
  std::string lm_head_name = "lm_head.weight";
  bool gemma_norm = false;     // RMSNorm scales by (1 + w) (in fp32), norms initialised to 0
  bool sandwich_norm = false;  // post-attention and pre/post-feedforward norms (4 norms a layer)
  bool gelu_mlp = false;       // GeGLU with gelu_pytorch_tanh instead of SwiGLU
  bool embed_scale = false;    // embeddings scaled by sqrt(hidden), rounded to the compute dtype
  double attn_scale = 0;       // softmax scale (query_pre_attn_scalar^-0.5); 0: head_dim^-0.5
  // Local attention layers: local_layer[l] true = layer l sees only the last local_window keys
  // (itself included; HF's kv_idx > q_idx - sliding_window) and uses rope_local.
  int64_t local_window = 0;
  std::vector<bool> local_layer;  // [n_layer] or empty (no local layers)
  RopeSpec rope_local;
  bool is_local(int layer) const { return layer >= 0 && size_t(layer) < local_layer.size() && local_layer[layer]; }
  bool has_local_rope() const { return !local_layer.empty(); }
  MoeSpec moe;
  Gemma4Spec gemma4;  // Arch::Gemma4 only
  bool is_moe() const { return moe.n_expert > 0; }
  bool moe_layer(int l) const { return is_moe() && moe.is_moe[size_t(l)] != 0; }

  int64_t q_dim() const { return int64_t(n_head) * head_dim; }
  int64_t kv_dim() const { return int64_t(n_kv_head) * head_dim; }
  // Checked arithmetic: an overflow is an InputError naming `source` (parse_model_spec computes
  // both, so a spec it returned never overflows them).
  int64_t layer_params() const;       // parameters of the largest decoder layer
  int64_t layer_params(int l) const;  // parameters of decoder layer l
  // Parameters a token multiplies in decoder layer l (MoE: router + top_k experts; dense: all).
  int64_t layer_active_params(int l) const;
  int64_t total_params() const;
  // Refuses (InputError naming `where`) a sliding window shorter than seq_len.
  void check_seq_len(int64_t seq_len, const std::string& where) const;
};

// Parses and validates config.json (`path` names the file in errors).
ModelSpec parse_model_spec(const nlohmann::json& cfg, const std::string& path);
ModelSpec load_model_spec(const std::string& config_path);

}  // namespace sf
