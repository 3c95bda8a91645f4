// Owned, 256-byte aligned host memory. Pinned variants come from a Device (backend/device.h).
#pragma once
#include <cstddef>
#include <cstdlib>
#include <new>
#include <utility>

#include "core/align.h"

namespace sf {

class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    size_t rounded = round256(bytes);
    ptr_ = std::aligned_alloc(256, rounded);
    if (!ptr_) throw std::bad_alloc();
  }
  ~HostBuffer() { std::free(ptr_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      std::free(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  void* data() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace sf
