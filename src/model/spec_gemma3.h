// Gemma 3 parts of parse_model_spec (spec.cpp), kept apart from the Llama-family parser.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "io/json_file.h"
#include "model/spec.h"

namespace sf::detail {

// For a Gemma 3 config (model_type gemma3_text / gemma3, or their architectures): the text
// model's config with Gemma3TextConfig's defaults filled in for absent keys (published gemma3
// checkpoints write only what differs from them), plus the outer config's model_type,
// architectures and dtype. Null for any other config.
nlohmann::json gemma3_text_config(const nlohmann::json& cfg, const std::string& path);

// The Gemma-only fields of s (norms, GeGLU, scales, local/global layers and their RoPE), from the
// config gemma3_text_config returned. Refuses what is not supported (soft-capping, other
// activations, bidirectional attention) with an InputError naming the file.
void apply_gemma3(const JsonRef& c, ModelSpec& s);

// cfg[key] when it is a string, else "" (the parsers proper report wrong types); the first entry
// of cfg["architectures"] when it is a string, else "". Shared by the Gemma 3 and 4 readers.
std::string config_string(const nlohmann::json& cfg, const char* key);
std::string config_first_architecture(const nlohmann::json& cfg);

// spec.cpp's RoPE parser (rope_theta + rope_scaling, or a flat rope_parameters) into s.rope.
void parse_rope(const JsonRef& c, ModelSpec& s);

}  // namespace sf::detail
