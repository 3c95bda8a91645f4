#include "engine/buffers.h"

#include <exception>

#include "core/error.h"

namespace sf {

size_t total_bytes(const MemoryItems& items, Place where) {
  size_t n = 0;
  for (const MemoryItem& m : items)
    if (m.place == where) n += m.bytes * m.count;
  return n;
}

MemoryItems merge_by_name(const MemoryItems& items) {
  MemoryItems out;
  for (Place where : {Place::Device, Place::Pinned, Place::Host, Place::Disk})
    for (const MemoryItem& m : items) {
      if (m.place != where) continue;
      bool merged = false;
      for (MemoryItem& o : out)
        if (o.name == m.name && o.place == m.place) {
          o.bytes += m.bytes * m.count;
          merged = true;
          break;
        }
      if (!merged) out.push_back({m.name, m.bytes * m.count, m.place, m.key});  // (the first item's key)
    }
  return out;
}

void append(MemoryItems& items, const MemoryItems& more) { items.insert(items.end(), more.begin(), more.end()); }

MemoryItems items_with(const MemoryItems& items, std::string_view prefix) {
  MemoryItems out;
  for (const MemoryItem& m : items)
    if (std::string_view(m.key).substr(0, prefix.size()) == prefix) out.push_back(m);
  return out;
}

BufferSource::BufferSource(Device& dev, MemoryItems items)
    : dev_(dev), items_(std::move(items)), taken_(items_.size(), 0) {}

BufferSource::~BufferSource() noexcept(false) {
  if (std::uncaught_exceptions() > 0) return;  // a constructor failed on its way: nothing to check
  for (size_t i = 0; i < items_.size(); ++i)
    SF_CHECK(taken_[i] == items_[i].count || items_[i].key.empty(),
             "buffer '" + items_[i].key + "' described but never allocated");
}

bool BufferSource::has(std::string_view key) const {
  for (size_t i = 0; i < items_.size(); ++i)
    if (taken_[i] < items_[i].count && items_[i].key == key) return true;
  return false;
}

const MemoryItem& BufferSource::take(std::string_view key) {
  for (size_t i = 0; i < items_.size(); ++i)
    if (taken_[i] < items_[i].count && items_[i].key == key) {
      ++taken_[i];
      return items_[i];
    }
  internal_error(__FILE__, __LINE__, "no buffer '" + std::string(key) + "' left in the buffer list");
}

void BufferSource::allocated(const MemoryItems& items) {
  for (const MemoryItem& m : items) {
    if (m.key.empty()) continue;
    for (size_t c = 0; c < m.count; ++c)
      SF_CHECK(take(m.key).bytes == m.bytes, "buffer '" + m.key + "' allocated with other bytes than listed");
  }
}

DeviceBuffer BufferSource::buffer(std::string_view key) {
  const MemoryItem& m = take(key);
  SF_CHECK(m.place != Place::Host && m.place != Place::Disk,
           "buffer '" + m.key + "' is pageable host memory or on disk, not a DeviceBuffer");
  return DeviceBuffer(dev_, m.bytes, m.place == Place::Pinned ? MemoryKind::PinnedHost : MemoryKind::Device);
}

}  // namespace sf
