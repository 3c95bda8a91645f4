#include "data/tokenizer/vocab_index.h"

#include <stdexcept>

namespace sf {

void VocabIndex::reserve(size_t n, size_t bytes) {
  bytes_.reserve(bytes);
  size_t cap = 16;
  while (cap < n * 2) cap *= 2;
  if (cap > slots_.size()) rehash(cap);
}

void VocabIndex::rehash(size_t slots) {
  std::vector<Slot> old(slots, Slot{});
  old.swap(slots_);
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    const uint64_t h = hash_text(std::string_view(bytes_.data() + s.off, s.len));
    size_t i = size_t(h) & mask;
    while (slots_[i].id >= 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

bool VocabIndex::insert(std::string_view key, int32_t id) {
  if (id < 0) throw std::logic_error("VocabIndex::insert: negative id");
  if ((n_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
  const uint64_t h = hash_text(key);
  const uint32_t tag = uint32_t(h >> 32);
  const size_t mask = slots_.size() - 1;
  size_t i = size_t(h) & mask;
  for (; slots_[i].id >= 0; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.tag == tag && s.len == key.size() && std::memcmp(bytes_.data() + s.off, key.data(), key.size()) == 0)
      return false;
  }
  // Offsets are 32-bit: the arena holds the keys of one tokenizer.json (at most 256 MiB).
  if (bytes_.size() + key.size() > UINT32_MAX) throw std::length_error("VocabIndex: more than 4 GiB of tokens");
  slots_[i] = Slot{uint32_t(bytes_.size()), uint32_t(key.size()), tag, id};
  bytes_.append(key);
  ++n_;
  return true;
}

}  // namespace sf
