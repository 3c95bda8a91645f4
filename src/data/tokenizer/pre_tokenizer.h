// The pre-tokenizers of a tokenizer.json (Hugging Face tokenizers' semantics), in any Sequence:
// Split (the Llama 3, Qwen2, GPT-2, Mistral Nemo (tekken) and DeepSeek-V3 regular expressions, matched by hand over code points, or
// a literal string; every split behavior), ByteLevel, Metaspace, Digits, Punctuation, WhitespaceSplit. Anything else is
// refused at load.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer/tokenizer_json.h"

namespace sf {

struct Piece {
  std::string text;
  bool at_start;  // starts at offset 0 of the original text (Metaspace's "first" scheme)
};

class PreTokenizer {
 public:
  static PreTokenizer from_json(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path);
  // Splits `pieces` further (and transforms them: ByteLevel, Metaspace), as each step in turn.
  void apply(std::vector<Piece>& pieces) const;
  bool byte_level() const { return byte_level_; }    // pieces come out as GPT-2's byte characters
  bool metaspace() const { return !meta_.empty(); }  // U+2581 (or the replacement) stands for spaces
  const std::string& meta_replacement() const { return meta_; }
  bool meta_prepends() const { return meta_prepends_; }
  bool empty() const { return steps_.empty(); }
  // The fast path of the byte-level pre-tokenizers of Llama 3, Qwen2 and GPT-2 (one regular
  // expression, then GPT-2's byte characters): the pieces of `text` (as apply() gives them for
  // Piece{text}) as byte ranges [first, second) of the text, whose bytes apply() would map to GPT-2's
  // characters one by one. False (spans untouched) for any other pre-tokenizer. Text below 4 GiB.
  bool byte_spans(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& spans) const;

  enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
  enum class Regex { None, Llama3, Qwen2, Gpt2, Tekken, Digits3, Cjk, Deepseek };

 private:
  enum class Kind { Split, ByteLevel, Metaspace, Digits, Punctuation, WhitespaceSplit, Whitespace };
  struct Step {
    Kind kind;
    Regex regex = Regex::None;
    std::string literal;  // Split with a literal pattern; Metaspace's replacement
    Behavior behavior = Behavior::Isolated;
    bool flag = false;   // ByteLevel: add_prefix_space; Digits: individual_digits; Metaspace: split
    bool flag2 = false;  // ByteLevel: use_regex
    int prepend = 0;     // Metaspace: 0 never, 1 first, 2 always
  };
  std::vector<Step> steps_;
  bool byte_level_ = false;
  std::string meta_;
  bool meta_prepends_ = false;
  Regex span_regex_ = Regex::None;  // byte_spans() applies: the regular expression
  void add(const tokjson::Ctx& c, const nlohmann::json& j, const std::string& path, int depth);
};

// The pieces of Split with one of those patterns (for tests).
std::vector<std::string> regex_pieces(PreTokenizer::Regex r, const std::string& text);

}  // namespace sf
