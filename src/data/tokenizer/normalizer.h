// The normalizers of a tokenizer.json (Hugging Face tokenizers' semantics): NFC, NFD, NFKC, NFKD
// (utf8proc, limited to what Unicode 9.0 normalizes, as tokenizers' own tables), Lowercase, Strip,
// Replace (a literal pattern), Prepend, and Sequence of them. Anything else is refused at load.
#pragma once
#include <string>
#include <vector>

#include "data/tokenizer/tokenizer_json.h"

namespace sf {

class Normalizer {
 public:
  // `j` is the "normalizer" value (null: none).
  static Normalizer from_json(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path);
  bool empty() const { return steps_.empty(); }
  // Normalizes s in place. `at_start`: whether s's first character is the text's first (cleared
  // when a Strip removes leading characters, as the offsets of tokenizers then say). InputError
  // naming the file when the text would grow past kGrowthFactor x its size + kGrowthSlack bytes.
  void apply(std::string& s, bool& at_start) const;
  // NFKD of one character writes up to 18 (U+FDFA); Prepend adds its content once.
  static constexpr size_t kGrowthFactor = 32;
  static constexpr size_t kGrowthSlack = 4096;
  // Where each byte of apply()'s output comes from: per output byte, the byte range [first, second)
  // of `s` (as tokenizers' alignments: a replaced or prepended piece maps to the character(s) it
  // stands for; a Unicode form maps each independently normalizing run to the whole run). Empty
  // when the alignment is unknown (a run of more than kMaxRun bytes that do not normalize apart).
  std::vector<std::pair<size_t, size_t>> align(const std::string& s, bool at_start) const;
  static constexpr size_t kMaxRun = 256;

 private:
  enum class Kind { NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend };
  struct Step {
    Kind kind;
    bool left = false, right = false;  // Strip
    std::string pattern, content;      // Replace (pattern -> content), Prepend (content)
  };
  std::vector<Step> steps_;
  std::string file_;  // the tokenizer.json (errors)
  void add(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path, int depth);
};

// Unicode normalization of UTF-8 text, form "NFC", "NFD", "NFKC" or "NFKD" (invalid UTF-8: unchanged).
std::string unicode_normalize(const std::string& s, const char* form);

}  // namespace sf
