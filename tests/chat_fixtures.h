// A small byte-level tokenizer for chat tests: the llama3 fixture plus the given special tokens
// (ids from 408 on), as tokenizer.json.
#pragma once
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "io/json_file.h"

namespace sf::test {

inline nlohmann::json chat_tokenizer_json(std::initializer_list<const char*> specials = {
                                              "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>",
                                              "<|im_end|>"}) {
  nlohmann::json j = read_json_file(std::string(SF_SOURCE_DIR) + "/tests/data/tokenizer/llama3.json");
  int id = 408;
  for (const char* s : specials)
    j["added_tokens"].push_back({{"id", id++},
                                 {"content", s},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  return j;
}

}  // namespace sf::test
