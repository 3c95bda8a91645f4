// Built-in model shapes for bench and plan (no files needed).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace sf {

// Built-in configs (config.json as Hugging Face writes it): llama-1b (Llama-3.2-1B shapes),
// llama-3b, llama-8b, qwen2.5-7b, and the MoE shapes qwen3-30b-a3b, mixtral-8x7b, olmoe-1b-7b.
// An unknown name is an InputError naming --preset.
nlohmann::json preset_config(const std::string& name);

}  // namespace sf
