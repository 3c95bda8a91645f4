// Built-in model shapes for bench and plan (no files needed).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sf {

// Built-in configs (config.json as Hugging Face writes it, the published shapes): llama-1b,
// llama-3b (Llama 3.2), llama-8b (Llama 3.1), llama-13b (Llama 2), llama-70b (Llama 3),
// mistral-24b (Mistral Small 24B), mistral-123b (Mistral Large 2), qwen2.5-7b, gemma3-4b (Gemma 3
// 4B's text model), and the MoE shapes qwen3-30b-a3b, mixtral-8x7b, olmoe-1b-7b. An unknown name
// is an InputError naming --preset.
nlohmann::json preset_config(const std::string& name);
const std::vector<std::string>& preset_names();

}  // namespace sf
