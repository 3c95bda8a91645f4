// tokenizer.json's normalizer and pre-tokenizer: the input is a normalizer (JSON) on the first line,
// a pre-tokenizer on the second, and text after; they replace those of a real tokenizer.json
// (SF_FUZZ_TOKENIZER), which is loaded and encodes the text. Bad input may only be an InputError
// (at load, or an encoding that grows past the normalizer's bound); encode and encode_offsets must
// agree, and the offsets must lie in the text and never decrease.
#include <nlohmann/json.hpp>

#include "data/tokenizer/tokenizer.h"
#include "fuzz_common.h"
#include "io/json_file.h"

namespace {

const nlohmann::json& base() {
  static const nlohmann::json j = sf::read_json_file(SF_FUZZ_TOKENIZER);
  return j;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t l1 = input.find('\n');
  if (l1 == std::string::npos) return 0;
  const size_t l2 = input.find('\n', l1 + 1);
  if (l2 == std::string::npos) return 0;
  nlohmann::json j = base();
  const nlohmann::json norm = nlohmann::json::parse(input.substr(0, l1), nullptr, false);
  const nlohmann::json pre = nlohmann::json::parse(input.substr(l1 + 1, l2 - l1 - 1), nullptr, false);
  if (norm.is_discarded() || pre.is_discarded()) return 0;
  j["normalizer"] = norm;
  j["pre_tokenizer"] = pre;
  std::string text;
  try {
    text = j.dump();
  } catch (const nlohmann::json::exception&) {
    return 0;  // invalid UTF-8 in a string: not a file anyone can write as JSON
  }
  const std::string sample = input.substr(l2 + 1);
  sf::fuzz::expect_input_error_or_success([&] {
    const sf::Tokenizer t = sf::Tokenizer::parse(text, "tokenizer.json");
    const std::vector<int32_t> ids = t.encode(sample, false);
    std::vector<std::pair<size_t, size_t>> off;
    const std::vector<int32_t> again = t.encode_offsets(sample, off, true);
    if (again.size() != off.size()) __builtin_trap();
    size_t prev = 0;
    for (const auto& [a, b] : off) {
      if (a > b || b > sample.size() || a < prev) __builtin_trap();
      prev = a;
    }
    const std::vector<int32_t> plain = t.encode_offsets(sample, off, false);
    if (plain != ids) __builtin_trap();  // the same ids as encode()
  });
  return 0;
}
