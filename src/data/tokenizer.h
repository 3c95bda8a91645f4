// BPE tokenizers from a Hugging Face tokenizer.json, two kinds:
//  - byte-level (Llama 3, Qwen2/2.5/3, GPT-2-style): added (special) tokens matched literally
//    first, the pre-tokenizer's split (the Llama 3 / Qwen2 regex or GPT-2's, matched by hand over
//    code points), bytes mapped to GPT-2's printable characters, BPE merges by rank (or a whole word
//    straight from the vocabulary with `ignore_merges`);
//  - SentencePiece-style (Llama 2, Mistral): spaces as U+2581 with one prepended (the legacy
//    Prepend+Replace normalizer: on every text segment; Metaspace: on the first, or every, as its
//    prepend_scheme says), BPE over characters, unknown characters as <0xXX> byte tokens;
// then the post-processor's template (e.g. a BOS first).
// Not supported (refused with the file and what): Unigram/WordPiece models, other pre-tokenizer
// patterns, other normalizers (NFC is accepted and its input assumed NFC already).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace sf {

class Tokenizer {
 public:
  // InputError naming the file for anything missing or unsupported.
  static Tokenizer load(const std::string& path);

  // Token ids of `text` (UTF-8); with add_special the post-processor's tokens (a BOS) are added.
  std::vector<int32_t> encode(const std::string& text, bool add_special = true) const;
  // The text of ids (byte-level decoding; special tokens as their content).
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const { return int64_t(id_to_token_.size()); }

  // The pre-tokenizer alone: the pieces text is split into before BPE (for tests).
  std::vector<std::string> pre_tokenize(const std::string& text) const;

 private:
  enum class Split { Gpt2, Llama3, Qwen2, SentencePiece };
  Split split_ = Split::Llama3;
  bool sp_prepend_all_ = true;  // SentencePiece: prepend U+2581 to every segment (else the first)
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;  // consecutive unknown symbols give one unk
  int32_t unk_ = -1;
  int32_t byte_token_[256] = {};  // SentencePiece: id of <0xXX>
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> vocab_;  // byte-level token text -> id
  std::vector<std::string> id_to_token_;            // id -> token text (added tokens: their content)
  std::map<std::pair<std::string, std::string>, int> merge_rank_;
  std::vector<std::pair<std::string, int32_t>> added_;  // literal content -> id, longest first
  std::vector<int32_t> prefix_, suffix_;                // post-processor tokens around the sequence
  bool added_first_[256] = {};                          // bytes an added token can start with
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;

  void bpe(const std::string& piece, std::vector<int32_t>& out) const;    // byte-level
  void sp_bpe(const std::string& text, std::vector<int32_t>& out) const;  // SentencePiece: normalized text
  // BPE merges over symbols (by rank, leftmost first).
  void merge(std::vector<std::string>& sym) const;
};

}  // namespace sf
