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
  // Diagnostics (SF_TRACE): an event that also notes when the stream reached it, and the seconds
  // between two such events once both are complete. Not for the hot path of a plain run.
  virtual std::unique_ptr<Event> create_timing_event() = 0;
  virtual double elapsed_seconds(Event& from, Event& to) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) = 0;
  // Runs fn on the host once the stream's earlier work is done (ordered in the stream).
  virtual void host_fn(Stream& s, std::function<void()> fn) = 0;

  virtual Ops& ops() = 0;
};

enum class MemoryKind { Device, PinnedHost };

// Owned device memory, or page-locked host memory for buffers that DMA touches (RAII).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& d, size_t bytes, MemoryKind kind = MemoryKind::Device) : dev_(&d), size_(bytes), kind_(kind) {
    if (bytes) ptr_ = kind == MemoryKind::Device ? d.alloc(bytes) : d.alloc_pinned(bytes);
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : dev_(o.dev_), size_(o.size_), kind_(o.kind_), ptr_(o.ptr_) {
    o.ptr_ = nullptr;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      dev_ = o.dev_;
      size_ = o.size_;
      kind_ = o.kind_;
      ptr_ = o.ptr_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  void* data() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void release() {
    if (!ptr_) return;
    if (kind_ == MemoryKind::Device) {
      dev_->free(ptr_);
    } else {
      dev_->free_pinned(ptr_);
    }
    ptr_ = nullptr;
  }
  Device* dev_ = nullptr;
  size_t size_ = 0;
  MemoryKind kind_ = MemoryKind::Device;
  void* ptr_ = nullptr;
};

// What a backend's buffers cost, known without creating a device (the planner's input).
enum class DeviceKind { Cpu, Cuda };
inline const char* device_kind_name(DeviceKind k) { return k == DeviceKind::Cuda ? "cuda" : "cpu"; }

// The GPU budget when none is given: 90 % of the device's free memory (a 256-byte multiple). The
// CUDA arena's default size and the planner's default budget, so the two agree.
inline size_t default_gpu_budget(size_t device_free) { return size_t(double(device_free) * 0.9) / 256 * 256; }

struct BackendInfo {
  DeviceKind kind = DeviceKind::Cpu;
  DType compute_dtype;        // its natural activation / compute-copy dtype
  size_t stream_scratch = 0;  // device bytes each stream that runs kernels takes on first use
  size_t (*attention_ws)(const AttnDims&) = nullptr;
  size_t (*linear_ce_ws)(int64_t N, int64_t H, int64_t V) = nullptr;
  size_t device_total = 0, device_free = 0;  // device memory (0: unknown / host memory)
};
// "cpu", "cuda" or "auto" (cuda when available); InputError when cuda is not built in. `ordinal`:
// which GPU (cudaSetDevice's number).
BackendInfo backend_info(const std::string& which, int ordinal = 0);
// The cuda backend's sizes without asking a GPU (device memory 0), in every build: for planning
// another machine (`plan --hardware`); backend_info("cuda") adds this machine's device memory.
BackendInfo cuda_backend_sizes();

// Backends. make_cuda_device throws InputError when no GPU is usable or CUDA is not built in.
std::unique_ptr<Device> make_cpu_device();
std::unique_ptr<Device> make_cuda_device(size_t arena_bytes, int ordinal = 0);
bool cuda_available();  // built with CUDA and a GPU is present
// "cpu", "cuda", or "auto" (cuda when available). arena_bytes: 0 = default_gpu_budget of the free
// memory. ordinal: which GPU (0: the first; ignored by the cpu backend).
std::unique_ptr<Device> make_device(const std::string& which, size_t arena_bytes = 0, int ordinal = 0);

}  // namespace sf
