// One description of the buffers an engine allocates (docs/ENGINE.md "Buffers"). Each engine, and
// each part of one (slot cache, host optimizer, checkpoint store, token uploader), has a function
// that lists its buffers — name, place, bytes — from its configuration alone, without a device.
// The part's constructor allocates from that list (BufferSource: every item taken, by key, in
// order, none left over), and the planner sums the engine's list. So the engines and the plan
// cannot drift; tests/test_engine_buffers.cpp counts what a device really hands out.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device.h"

namespace sf {

// GPU memory, page-locked host memory, pageable host memory, the NVMe store's files (--offload-dir)
enum class Place { Device, Pinned, Host, Disk };

struct MemoryItem {
  std::string name;  // what `slideformer plan` prints (items of one name are one line there)
  size_t bytes = 0;
  Place place = Place::Device;
  // Which buffer (the allocating part looks it up by this); "" for bytes that the backend, not the
  // engine, allocates (the CUDA backend's per-stream scratch).
  std::string key = {};
  // That many buffers of `bytes` each (one item, not `count` items: the planner also lists the
  // engines for --grad-accum values it then refuses, with 2 token buffers a micro-batch).
  size_t count = 1;
};
using MemoryItems = std::vector<MemoryItem>;

// What an engine's list needs beyond its options: the compute dtype (activations, the compute copy
// of the weights, gradients on their way down), the workspace's bytes (Workspace::bytes_for with the
// backend's attention and linear-CE formulas) and the backend's own scratch per compute stream
// (listed, allocated by the backend: the CUDA device's cuBLASLt and kernel scratch).
struct BackendSizes {
  DType act = DType::F32;
  size_t workspace = 0;
  size_t stream_scratch = 0;
};

size_t total_bytes(const MemoryItems& items, Place where);  // bytes x count, summed
// One item per name and place, bytes x count summed (the plan's lines): by place (Device, Pinned, Host),
// each in the order of its first appearance.
MemoryItems merge_by_name(const MemoryItems& items);
// Appends `more` to `items`.
void append(MemoryItems& items, const MemoryItems& more);
// The items whose key starts with `prefix`.
MemoryItems items_with(const MemoryItems& items, std::string_view prefix);

// Hands out the items of a list to the constructor that allocates them: take(key) is the next item
// of that key not yet taken (an item of count n is taken n times); the destructor checks that every
// item with a key was taken (an item described but not allocated is a bug).
class BufferSource {
 public:
  BufferSource(Device& dev, MemoryItems items);
  ~BufferSource() noexcept(false);
  BufferSource(const BufferSource&) = delete;
  BufferSource& operator=(const BufferSource&) = delete;

  // The next item of `key` (an error when there is none).
  const MemoryItem& take(std::string_view key);
  // A part that allocates its own buffers from its own list (`items`, made by the same function
  // from the same configuration) or a buffer sized elsewhere (the workspace): its items are taken,
  // and must be there with these bytes.
  void allocated(const MemoryItems& items);
  // Whether an item of `key` is left.
  bool has(std::string_view key) const;
  // The next item of `key` allocated on the device or page-locked, as its place says.
  DeviceBuffer buffer(std::string_view key);
  // buffer(key), or an empty buffer when the list has no such item (a buffer the configuration
  // does not need).
  DeviceBuffer buffer_if(std::string_view key) { return has(key) ? buffer(key) : DeviceBuffer(); }

 private:
  Device& dev_;
  MemoryItems items_;
  std::vector<size_t> taken_;  // [items] times taken
};

}  // namespace sf
