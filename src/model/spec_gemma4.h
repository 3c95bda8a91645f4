// Gemma 4 parts of parse_model_spec (spec.cpp): reading and checking a gemma4_text config (or a
// gemma4 checkpoint's text_config) into ModelSpec::gemma4 (and, with the MoE block, ModelSpec::moe).
// Every part read trains (dense, K/V sharing, per-layer inputs, the MoE block); parse_model_spec
// would refuse, naming its key, a part gemma4_missing lists; read_gemma4_spec is the same reading
// without that refusal.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "io/json_file.h"
#include "model/spec.h"

namespace sf {

// A Gemma 4 config read and checked as parse_model_spec would (every bound; hostile values are an
// InputError naming the file and key), without the final "not supported yet". For tests and for
// the work that follows (docs/GEMMA4.md, "Order of work").
ModelSpec read_gemma4_spec(const nlohmann::json& cfg, const std::string& path);

namespace detail {

// For a Gemma 4 config (model_type gemma4_text / gemma4, or a Gemma4* architecture): the text
// model's config with Gemma4TextConfig's defaults filled in for absent keys, plus the outer
// config's model_type, architectures, dtype and tie_word_embeddings. Null for any other config.
nlohmann::json gemma4_text_config(const nlohmann::json& cfg, const std::string& path);

// The Gemma-4-only fields of s (s.gemma4, the layer types and their RoPE, the norms, GeGLU and
// scales), from the config gemma4_text_config returned; s's common fields are read already.
void apply_gemma4(const JsonRef& c, ModelSpec& s);

// Parameters of Gemma 4 decoder layer l (active_only: the router and top_k experts of a MoE
// block instead of all experts), and the model-level ones besides the embedding, final norm and
// untied head (the per-layer input embeddings' table, projection and norm). Checked arithmetic.
int64_t gemma4_layer_params(const ModelSpec& s, int l, bool active_only);
int64_t gemma4_model_params(const ModelSpec& s);

// What a Gemma 4 config needs that slideformer cannot train yet, as a list naming the config keys
// for the refusal; empty for a dense model.
std::string gemma4_missing(const ModelSpec& s);

}  // namespace detail
}  // namespace sf
