// A Device: memory, streams, events, copies and the kernel table (ops.h).
// Event semantics follow CUDA: record() captures the stream's work so far; wait() makes a
// stream wait for the most recent record (no-op if never recorded); synchronize() blocks the host.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "backend/ops.h"

namespace sf {

struct Stream {
  virtual ~Stream() = default;
};
struct Event {
  virtual ~Event() = default;
};

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // True when device memory is ordinary host memory (cpu backend).
  virtual bool is_host() const = 0;

  // Device memory. Call at start-up only (the cuda backend sub-allocates one arena).
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  // Page-locked host memory, for buffers that DMA touches.
  virtual void* alloc_pinned(size_t bytes) = 0;
  virtual void free_pinned(void* p) = 0;

  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  virtual void record(Event& e, Stream& s) = 0;
  virtual void wait(Stream& s, Event& e) = 0;
  virtual void synchronize(Event& e) = 0;
  virtual void synchronize(Stream& s) = 0;
  virtual bool query(Event& e) = 0;  // true when the recorded work is done
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) = 0;
  // Runs fn on the host once the stream's earlier work is done (ordered in the stream).
  virtual void host_fn(Stream& s, std::function<void()> fn) = 0;

  virtual Ops& ops() = 0;
};

// Owned device allocation (RAII).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& d, size_t bytes) : dev_(&d), size_(bytes), ptr_(bytes ? d.alloc(bytes) : nullptr) {}
  ~DeviceBuffer() {
    if (ptr_) dev_->free(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), size_(o.size_), ptr_(o.ptr_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) dev_->free(ptr_);
      dev_ = o.dev_;
      size_ = o.size_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  void* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  Device* dev_ = nullptr;
  size_t size_ = 0;
  void* ptr_ = nullptr;
};

// Owned pinned host allocation (RAII).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(Device& d, size_t bytes) : dev_(&d), size_(bytes), ptr_(bytes ? d.alloc_pinned(bytes) : nullptr) {}
  ~PinnedBuffer() {
    if (ptr_) dev_->free_pinned(ptr_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : dev_(o.dev_), size_(o.size_), ptr_(o.ptr_) { o.ptr_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) dev_->free_pinned(ptr_);
      dev_ = o.dev_;
      size_ = o.size_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  void* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  Device* dev_ = nullptr;
  size_t size_ = 0;
  void* ptr_ = nullptr;
};

// Backends. make_cuda_device throws InputError when no GPU is usable or CUDA is not built in.
std::unique_ptr<Device> make_cpu_device();
std::unique_ptr<Device> make_cuda_device(size_t arena_bytes);
bool cuda_available();  // built with CUDA and a GPU is present
// "cpu", "cuda", or "auto" (cuda when available). arena_bytes: 0 = a default share of free memory.
std::unique_ptr<Device> make_device(const std::string& which, size_t arena_bytes = 0);

}  // namespace sf
