// A BPE model's vocabulary, token text -> id: one open-addressing table over one byte arena, so a
// 128k-token vocabulary is built without an allocation per token and looked up by string_view
// (the encoder's ignore_merges and invalid-UTF-8 look-ups build no std::string).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace sf {

// A hash of a token or piece (8 bytes at a time).
inline uint64_t hash_text(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  if (n > 0) std::memcpy(&w, p, n);
  h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 29);
}

class VocabIndex {
 public:
  // Room for n tokens of `bytes` bytes in all (no rehash while they are inserted).
  void reserve(size_t n, size_t bytes);
  // false when `key` is already there (its id is kept).
  bool insert(std::string_view key, int32_t id);
  // The id of key, or -1.
  int32_t find(std::string_view key) const {
    if (slots_.empty()) return -1;
    const uint64_t h = hash_text(key);
    const uint32_t tag = uint32_t(h >> 32);
    const size_t mask = slots_.size() - 1;
    for (size_t i = size_t(h) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.tag == tag && s.len == key.size() && std::memcmp(bytes_.data() + s.off, key.data(), key.size()) == 0)
        return s.id;
    }
  }
  bool contains(std::string_view key) const { return find(key) >= 0; }
  size_t size() const { return n_; }
  // fn(token, id) for every entry (in no particular order).
  template <class Fn>
  void each(Fn&& fn) const {
    for (const Slot& s : slots_)
      if (s.id >= 0) fn(std::string_view(bytes_.data() + s.off, s.len), s.id);
  }

 private:
  struct Slot {
    uint32_t off = 0, len = 0;  // the token's bytes in bytes_
    uint32_t tag = 0;           // high half of its hash
    int32_t id = -1;            // -1: empty
  };
  std::string bytes_;        // every token's text, back to back
  std::vector<Slot> slots_;  // power-of-two size, at most half full
  size_t n_ = 0;
  void rehash(size_t slots);
};

}  // namespace sf
