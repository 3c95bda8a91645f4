// The two large values of a tokenizer.json, model.vocab and model.merges (Llama 3: 128k tokens and
// 280k merges, most of its 9 MB), read straight from the file's text instead of through a JSON tree:
// building and freeing that tree was ~0.4 s of a 0.45 s load, all of it before any data is
// tokenized. The scan accepts a subset of what the JSON parser accepts, with the same values:
// strings with valid escapes and well-formed UTF-8, vocab ids as plain integers, merges all
// "a b" strings or all ["a", "b"] pairs, no duplicate key. On anything else (a syntax error, a
// duplicate, a float id, an unusual form) it declines, and the file is read through the tree as
// before, with that path's checks and messages.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer/vocab_index.h"

namespace sf {

struct ScannedBpe {
  // The file's text with model.vocab's value replaced by {} and model.merges' by []: the small
  // rest (normalizer, pre-tokenizer, added tokens ...) for the JSON parser.
  std::string rest;
  VocabIndex vocab;  // model.vocab (ids not yet checked against the number of tokens)
  // model.merges in rank order ("#version" lines left out): each merge's two parts back to back in
  // merge_bytes, so that the pair's concatenation is one string_view too.
  struct Merge {
    uint32_t off, a_len, b_len;
  };
  std::string merge_bytes;
  std::vector<Merge> merges;

  std::string_view left(const Merge& m) const { return std::string_view(merge_bytes).substr(m.off, m.a_len); }
  std::string_view right(const Merge& m) const {
    return std::string_view(merge_bytes).substr(m.off + m.a_len, m.b_len);
  }
  std::string_view joined(const Merge& m) const {
    return std::string_view(merge_bytes).substr(m.off, m.a_len + m.b_len);
  }
};

// Fills `out` from a tokenizer.json's text; false when the text is not of the form above (then
// `out` is unspecified and the caller parses the whole text).
bool scan_bpe(std::string_view text, ScannedBpe& out);

}  // namespace sf
