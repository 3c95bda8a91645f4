// BPE tokenizers from a Hugging Face tokenizer.json, with the ids Hugging Face `tokenizers` (0.23)
// gives: added tokens matched literally first (leftmost, longest), then per remaining segment the
// normalizer (normalizer.h), the pre-tokenizer (pre_tokenizer.h), the BPE model (merges by rank
// over the pieces' characters; ignore_merges, byte_fallback, unk with fuse_unk), and the
// post-processor's template (e.g. a BOS first). This covers the files of Llama 2/3/3.x, Mistral
// v0.1/v0.3 and Qwen2/2.5/3.
// Loading validates like tokenizers: JSON nesting at most 256 deep, types, ids in range and unique,
// merges whose parts and result are in the vocabulary; anything malformed or unsupported (Unigram,
// WordPiece, other regular expressions, normalizers, processors, truncation, padding) is an
// InputError naming the file, the JSON path and the component.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer/normalizer.h"
#include "data/tokenizer/pre_tokenizer.h"
#include "data/tokenizer/vocab_index.h"

namespace sf {

struct ScannedBpe;

class Tokenizer {
 public:
  static Tokenizer load(const std::string& path);
  // The same from the file's text (`path` names it in errors).
  static Tokenizer parse(const std::string& text, const std::string& path);

  // Token ids of `text` (UTF-8); with add_special the post-processor's tokens (a BOS) are added.
  // Thread-safe (const; caches are per thread).
  std::vector<int32_t> encode(const std::string& text, bool add_special = true) const;
  // encode() of every text, on `threads` threads (0: usable_cpus(), core/thread_pool.h); results in order.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts, bool add_special = true,
                                                 int threads = 0) const;
  // The text of ids (byte-level or SentencePiece-style decoding; added tokens as their content).
  std::string decode(const std::vector<int32_t>& ids) const;
  // encode() with each token's byte range [first, second) in `text` (as tokenizers' offsets, for
  // assistant masks): exact where the tokens spell the text, through the normalizer's character
  // alignment where it normalizes characters one by one (NFC, Lowercase); elsewhere each token of a
  // stretch between added tokens spans the whole stretch. Slower than encode(): for labels only.
  std::vector<int32_t> encode_offsets(const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets,
                                      bool add_special = false) const;
  // Identifies what encode() does: the file's bytes and this implementation's revision (bumped
  // whenever ids could change), for keys of tokenized-data caches.
  uint64_t fingerprint() const { return fingerprint_; }
  // One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const { return int64_t(id_to_token_.size()); }

  // The normalizer and pre-tokenizer alone: the pieces text is split into before BPE (for tests),
  // as the text of the original (ByteLevel's byte characters mapped back).
  std::vector<std::string> pre_tokenize(const std::string& text) const;

 private:
  struct Added {
    std::string content;
    int32_t id;
    bool normalized;
  };
  Normalizer normalizer_;
  PreTokenizer pre_;
  // Model.
  VocabIndex vocab_;  // model.vocab
  std::vector<std::string> id_to_token_;  // id -> token text (added tokens: their content)
  struct MergeSlot {
    uint64_t key;  // (left id << 32 | right id) + 1; 0 = empty
    int32_t rank, id;
  };
  std::vector<MergeSlot> merges_;  // open addressing, power-of-two size
  std::vector<int32_t> char_id_;   // id of each character below U+0800 as a symbol (-1: none);
                                   // GPT-2's byte characters are all there
  // The other characters that are tokens: (code point, id), open addressing, code point 0 empty.
  std::vector<std::pair<uint32_t, int32_t>> wide_char_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  int32_t unk_ = -1;
  int32_t byte_token_[256];
  std::vector<Added> added_;  // longest first
  bool any_normalized_ = false;
  std::vector<uint32_t> added_by_byte_[2][256];  // [normalized][first byte] -> indices in added_
  std::vector<int32_t> prefix_, suffix_;
  std::string word_break_;  // SentencePiece-style: where long pieces may be cut (empty: never)
  std::vector<uint32_t> token_bytes_;  // byte-level: bytes of each id's text (encode_offsets)
  uint64_t serial_ = 0;
  uint64_t fingerprint_ = 0;  // identifies the loaded file for the per-thread caches

  // parse() of the parsed tree j (text_hash: hash_text of the file's text); with `scanned`
  // (bpe_scan.h) model.vocab and model.merges come from it (j is the rest): nullopt when they do
  // not pass the checks (the tree path reports why).
  static std::optional<Tokenizer> build(const std::string& path, const nlohmann::json& j, ScannedBpe* scanned,
                                        uint64_t text_hash);
  const MergeSlot* find_merge(int32_t a, int32_t b) const;
  int32_t wide_char_id(uint32_t cp) const;
  void model(std::string_view piece, std::vector<int32_t>& out) const;
  void model_word(std::string_view piece, std::vector<int32_t>& out) const;
  void model_bytes(std::string_view raw, std::vector<int32_t>& out) const;
  void word_ids(std::string_view piece, std::vector<int32_t>& sym) const;
  void merge(std::vector<int32_t>& sym) const;
  void segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  std::string token_text(const std::vector<int32_t>& ids) const;  // decode() keeping a leading space
  std::string token_piece(int32_t id) const;  // a token as the model's pieces spell it (<0xXX>: the byte)
  std::vector<uint32_t> byte_lengths() const;                      // token_bytes_
  size_t added_text_size(int32_t id) const;
  void encode_between_added(std::string_view raw, bool at_start, std::string& part, std::vector<int32_t>& out) const;
  void split_added(const std::string& text, bool normalized, std::vector<std::pair<size_t, size_t>>& segs,
                   std::vector<int32_t>& ids) const;
};

}  // namespace sf
