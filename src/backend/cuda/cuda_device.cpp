#include "backend/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "backend/cuda/adamw.cuh"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/bias.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/geglu.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/linear_ce.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_gemm.cuh"
#include "backend/cuda/rmsnorm.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/sq_norm.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/ops_check.h"
#include "core/align.h"
#include "core/error.h"

namespace sf {
namespace cuda {

void fail(const char* file, int line, const char* expr, const std::string& what) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " + what);
}

}  // namespace cuda

namespace {

std::string mib(size_t b) { return std::to_string(b >> 20) + " MiB"; }

// One cudaMalloc at start-up; first-fit free list keyed by offset, neighbours coalesced on free.
class Arena {
 public:
  explicit Arena(size_t bytes) : size_(round256(bytes)) {
    CUDA_CHECK(cudaMalloc(&base_, size_));
    free_[0] = size_;
  }
  ~Arena() { cudaFree(base_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc(size_t bytes) {
    const size_t need = round256(bytes ? bytes : 1);
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < need) continue;
      const size_t off = it->first, rest = it->second - need;
      free_.erase(it);
      if (rest) free_[off + need] = rest;
      used_[off] = need;
      in_use_ += need;
      return static_cast<char*>(base_) + off;
    }
    size_t largest = 0;
    for (auto& [o, s] : free_) largest = std::max(largest, s);
    throw std::runtime_error("cuda arena: out of memory allocating " + std::to_string(bytes) + " bytes (arena " +
                             mib(size_) + ", in use " + mib(in_use_) + ", largest free block " + mib(largest) + ")");
  }
  // Returns the bytes of the block freed.
  size_t free(void* p) {
    if (!p) return 0;
    std::lock_guard<std::mutex> lk(mu_);
    const size_t off = size_t(static_cast<char*>(p) - static_cast<char*>(base_));
    auto u = used_.find(off);
    if (u == used_.end()) throw std::runtime_error("cuda arena: free of a pointer it did not allocate");
    size_t start = off, len = u->second;
    const size_t freed = len;
    in_use_ -= len;
    used_.erase(u);
    auto next = free_.lower_bound(off);
    if (next != free_.end() && next->first == off + len) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[start] = len;
    return freed;
  }
  size_t size() const { return size_; }

 private:
  void* base_ = nullptr;
  size_t size_ = 0, in_use_ = 0;
  std::mutex mu_;
  std::map<size_t, size_t> free_;            // offset -> bytes
  std::unordered_map<size_t, size_t> used_;  // offset -> bytes
};

struct CudaStream final : Stream {
  cudaStream_t s = nullptr;
  std::shared_ptr<Arena> arena;
  std::mutex mu;
  cuda::Scratch scratch;     // taken from the arena on first use
  std::exception_ptr error;  // first failure of a host_fn; rethrown by synchronize(stream)

  explicit CudaStream(std::shared_ptr<Arena> a) : arena(std::move(a)) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~CudaStream() override {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    if (scratch.lt_ws) arena->free(scratch.lt_ws);
    if (scratch.buf) arena->free(scratch.buf);
  }
  const cuda::Scratch& get_scratch() {
    std::lock_guard<std::mutex> lk(mu);
    if (!scratch.lt_ws) {
      scratch.lt_ws = arena->alloc(cuda::kLtWorkspaceBytes);
      scratch.lt_bytes = cuda::kLtWorkspaceBytes;
      scratch.buf = arena->alloc(cuda::kKernelScratchBytes);
      scratch.buf_bytes = cuda::kKernelScratchBytes;
    }
    return scratch;
  }
};

// Host threads that wait for the GPU block instead of spinning (CUDA's default with fewer
// contexts than cores is to spin): a spinning thread takes a core from the host AdamW, which runs
// beside the step's one synchronisation (measured: docs/DECISIONS.md, "CUDA host waits block"). Set before
// the context exists; later calls fail harmlessly.
void set_sync_flags() {
  static const bool once = [] {
    (void)cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    (void)cudaGetLastError();
    return true;
  }();
  (void)once;
}

struct CudaEvent final : Event {
  cudaEvent_t e = nullptr;
  explicit CudaEvent(bool timing = false) {
    CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(e); }
};

CudaStream& cs(Stream& s) { return static_cast<CudaStream&>(s); }
CudaEvent& ce(Event& e) { return static_cast<CudaEvent&>(e); }

struct HostFnCtx {
  std::function<void()> fn;
  CudaStream* stream;
};

void CUDART_CB host_trampoline(void* p) {
  std::unique_ptr<HostFnCtx> ctx(static_cast<HostFnCtx*>(p));
  try {
    ctx->fn();
  } catch (...) {
    std::lock_guard<std::mutex> lk(ctx->stream->mu);
    if (!ctx->stream->error) ctx->stream->error = std::current_exception();
  }
}

class CudaOps final : public Ops {
 public:
  CudaOps(int num_sms) : num_sms_(num_sms) {}

  // Device memory freed or written by a copy: host copies of MoE offsets there are stale.
  void forget(const void* p, size_t bytes) { moe_.forget(p, bytes); }

  void matmul(Tensor out, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, Stream& s) override {
    cuda::matmul(out, a, b, ta, tb, alpha, beta, L(s));
  }
  void matmul_add(Tensor out, Tensor a, Tensor b, bool ta, bool tb, Tensor c, Stream& s) override {
    cuda::matmul_add(out, a, b, ta, tb, c, L(s));
  }
  void add_bias(Tensor out, Tensor bias, Stream& s) override { cuda::add_bias(out, bias, L(s)); }
  void bias_backward(Tensor dbias, Tensor dout, Stream& s) override { cuda::bias_backward(dbias, dout, L(s)); }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    cuda::rmsnorm_forward(out, rstd, x, w, eps, L(s));
  }
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                        Stream& s) override {
    cuda::rmsnorm_backward(dx, dw, dout, x, w, rstd, acc, L(s));
  }
  void rmsnorm_1p_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    cuda::rmsnorm_forward(out, rstd, x, w, eps, L(s), 1.f);
  }
  void rmsnorm_1p_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                           Stream& s) override {
    cuda::rmsnorm_backward(dx, dw, dout, x, w, rstd, acc, L(s), 1.f);
  }
  void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    cuda::rope_forward(x, cos, sin, T, nh, hd, pos, L(s));
  }
  void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    cuda::rope_backward(dx, cos, sin, T, nh, hd, pos, L(s));
  }
  void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm,
                 Stream& s) override {
    cuda::moe_route(probs, idx, weights, stats, logits, renorm, L(s));
  }
  void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                          float aux_scale, Stream& s) override {
    cuda::moe_route_backward(dlogits, dweights, probs, idx, renorm, counts, aux_scale, L(s));
  }
  void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx, Stream& s) override {
    cuda::moe_permute(offsets, sorted_slot, slot_pos, idx, L(s));
  }
  void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k, Stream& s) override {
    cuda::moe_gather(xs, x, sorted_slot, k, L(s));
  }
  void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k, Stream& s) override {
    cuda::moe_gather_backward(dx, dxs, slot_pos, k, L(s));
  }
  void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta,
                          Stream& s) override {
    cuda::moe_grouped_matmul(out, a, w, offsets, trans_w, beta, L(s));
  }
  void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, Stream& s) override {
    cuda::moe_grouped_matmul_wgrad(dw, dy, x, offsets, L(s));
  }
  void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos, Stream& s) override {
    cuda::moe_combine(y, ys, weights, slot_pos, L(s));
  }
  void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos,
                            Stream& s) override {
    cuda::moe_combine_backward(dys, dweights, dy, ys, weights, slot_pos, L(s));
  }
  void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale, Stream& s) override {
    cuda::moe_expert_scale(out, w, idx, scale, L(s));
  }
  void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale,
                                 Stream& s) override {
    cuda::moe_expert_scale_backward(dw, dscale, dout, w, idx, scale, L(s));
  }
  void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale, Stream& s) override {
    cuda::moe_aux_loss(loss_sum, stats, scale, L(s));
  }
  void swiglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    cuda::swiglu_forward(out, gate, up, L(s));
  }
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    cuda::swiglu_backward(dgate, dup, dout, gate, up, L(s));
  }
  void geglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    cuda::geglu_forward(out, gate, up, L(s));
  }
  void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    cuda::geglu_backward(dgate, dup, dout, gate, up, L(s));
  }
  void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, Stream& s) override {
    cuda::attention_forward(out, lse, q, k, v, d, L(s));
  }
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                          Tensor lse, const AttnDims& d, Tensor ws, Stream& s) override {
    cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, ws, L(s));
  }
  size_t attention_workspace_bytes(const AttnDims& d) const override { return cuda::attention_workspace_bytes(d); }
  void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                            Tensor ws, Stream& s) override {
    cuda::linear_cross_entropy(loss_sum, dx, dw, x, w, labels, gs, ws, L(s));
  }
  void linear_cross_entropy_capped(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                                   float cap, Tensor ws, Stream& s) override {
    cuda::linear_cross_entropy(loss_sum, dx, dw, x, w, labels, gs, ws, L(s), cap);
  }
  size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V) const override {
    return cuda::linear_ce_workspace_bytes(N, H, V);
  }
  void embedding_forward(Tensor out, Tensor ids, Tensor table, Stream& s) override {
    cuda::embedding_forward(out, ids, table, L(s));
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids, Stream& s) override {
    cuda::embedding_backward(dtable, dout, ids, L(s));
  }
  void ids_or_zero(Tensor out, Tensor ids, int64_t limit, Stream& s) override {
    cuda::ids_or_zero(out, ids, limit, L(s));
  }
  void add(Tensor out, Tensor a, Tensor b, Stream& s) override { cuda::add(out, a, b, L(s)); }
  void scale(Tensor x, float alpha, Stream& s) override { cuda::scale(x, alpha, L(s)); }
  // Elementwise ops take no scratch: they may run on copy streams without their 64 MiB.
  void cast(Tensor out, Tensor in, Stream& s) override { cuda::cast(out, in, L(s, false)); }
  void zero(Tensor x, Stream& s) override { cuda::zero(x, L(s)); }
  void sq_norm(Tensor out, Tensor x, Stream& s) override { cuda::sq_norm(out, x, L(s)); }
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, const AdamWParams& p, Stream& s) override {
    cuda::adamw(param, grad, m, v, copy, p, L(s));
  }

 private:
  cuda::Launch L(Stream& s, bool scratch = true) {
    CudaStream& st = cs(s);
    cuda::Launch l;
    l.stream = st.s;
    l.scratch = scratch ? &st.get_scratch() : nullptr;
    l.lt = &lt_;
    l.moe = &moe_;
    l.moe_streams = &moe_streams_;
    l.num_sms = num_sms_;
    return l;
  }
  int num_sms_;
  cuda::LtCache lt_;
  cuda::MoeOffsets moe_;
  cuda::ExpertStreams moe_streams_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(size_t arena_bytes, int ordinal) {
    set_sync_flags();
    CUDA_CHECK(cudaSetDevice(ordinal));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
    gpu_name_ = prop.name;
    ops_ = std::make_unique<CudaOps>(prop.multiProcessorCount);  // creates the cuBLASLt handle first
    checked_ = std::make_unique<CheckedOps>(*ops_);
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (arena_bytes == 0) arena_bytes = default_gpu_budget(free_b);
    if (arena_bytes > free_b)
      setting_error(Setting::GpuMemory, "the CUDA arena of " + mib(arena_bytes) + " does not fit in the " +
                                            mib(free_b) + " free on " + gpu_name_);
    arena_ = std::make_shared<Arena>(arena_bytes);
  }
  ~CudaDevice() override {
    cudaDeviceSynchronize();
    checked_.reset();
    ops_.reset();
  }

  std::string name() const override { return "cuda (" + gpu_name_ + ", arena " + mib(arena_->size()) + ")"; }
  bool is_host() const override { return false; }

  void* alloc(size_t bytes) override { return arena_->alloc(bytes); }
  void free(void* p) override {
    const size_t bytes = arena_->free(p);
    if (ops_) ops_->forget(p, bytes);  // host copies of MoE offsets there are stale
  }
  void* alloc_pinned(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable));
    return p;
  }
  void free_pinned(void* p) override {
    if (p) CUDA_CHECK(cudaFreeHost(p));
  }

  std::unique_ptr<Stream> create_stream() override { return std::make_unique<CudaStream>(arena_); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(); }
  std::unique_ptr<Event> create_timing_event() override { return std::make_unique<CudaEvent>(true); }
  double elapsed_seconds(Event& from, Event& to) override {
    float ms = 0.f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ce(from).e, ce(to).e));
    return double(ms) * 1e-3;
  }
  void record(Event& e, Stream& s) override { CUDA_CHECK(cudaEventRecord(ce(e).e, cs(s).s)); }
  void wait(Stream& s, Event& e) override { CUDA_CHECK(cudaStreamWaitEvent(cs(s).s, ce(e).e, 0)); }
  void synchronize(Event& e) override { CUDA_CHECK(cudaEventSynchronize(ce(e).e)); }
  void synchronize(Stream& s) override {
    CudaStream& st = cs(s);
    CUDA_CHECK(cudaStreamSynchronize(st.s));
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lk(st.mu);
      std::swap(err, st.error);
    }
    if (err) std::rethrow_exception(err);
  }
  bool query(Event& e) override {
    const cudaError_t r = cudaEventQuery(ce(e).e);
    if (r == cudaSuccess) return true;
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    CUDA_CHECK(r);
    return false;
  }
  void copy(void* dst, const void* src, size_t bytes, CopyKind kind, Stream& s) override {
    if (bytes == 0) return;
    const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                              : cudaMemcpyDeviceToDevice;
    if (kind != CopyKind::DeviceToHost && ops_) ops_->forget(dst, bytes);  // as free
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, cs(s).s));
  }
  void host_fn(Stream& s, std::function<void()> fn) override {
    auto* ctx = new HostFnCtx{std::move(fn), &cs(s)};
    const cudaError_t r = cudaLaunchHostFunc(cs(s).s, host_trampoline, ctx);
    if (r != cudaSuccess) delete ctx;
    CUDA_CHECK(r);
  }
  Ops& ops() override { return *checked_; }

 private:
  std::string gpu_name_;
  std::unique_ptr<CudaOps> ops_;
  std::unique_ptr<CheckedOps> checked_;  // the front every caller gets (ops_check.h)
  std::shared_ptr<Arena> arena_;
};

}  // namespace

void* cuda::native_stream(Stream& s) { return static_cast<void*>(cs(s).s); }

bool cuda_available() {
  static const bool ok = [] {
    int n = 0;
    const cudaError_t r = cudaGetDeviceCount(&n);
    if (r != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return ok;
}

// This machine's memory of GPU `ordinal` (0 and 0 without one); the backend's sizes are
// cuda_backend_sizes (backend/device_factory.cpp, in every build), which backend_info adds them to.
void cuda_device_memory(int ordinal, size_t& free_bytes, size_t& total_bytes) {
  free_bytes = total_bytes = 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > ordinal && ordinal >= 0) {
    set_sync_flags();  // before the first call that creates the context
    (void)cudaSetDevice(ordinal);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) free_bytes = free_b, total_bytes = total_b;
  }
  cudaGetLastError();  // no GPU is not an error here
}

std::unique_ptr<Device> make_cuda_device(size_t arena_bytes, int ordinal) {
  if (!cuda_available())
    setting_error(Setting::Device, {Setting::Device, " cuda"}, "no usable CUDA GPU (cudaGetDeviceCount found none)");
  int n = 0;
  CUDA_CHECK(cudaGetDeviceCount(&n));
  if (ordinal < 0 || ordinal >= n)
    setting_error(Setting::Device, {Setting::Device, " cuda"},
                  "no CUDA GPU " + std::to_string(ordinal) + " (" + std::to_string(n) + " found)");
  return std::make_unique<CudaDevice>(arena_bytes, ordinal);
}

}  // namespace sf
