#include "backend/cuda/moe_gemm.cuh"

#include <algorithm>
#include <atomic>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/moe.cuh"

namespace sf::cuda {

MoeOffsets::~MoeOffsets() {
  auto drop = [](Copy& c) {
    if (c.done) cudaEventSynchronize(c.done), cudaEventDestroy(c.done);
    if (c.host) cudaFreeHost(c.host);
  };
  for (auto& [p, c] : live_) drop(c);
  for (Copy& c : spare_) drop(c);
  drop(fresh_);
}

// Under mu_. A spare buffer is reused only once its last copy has landed: a copy still in flight
// on another stream must not write over a newer one.
MoeOffsets::Copy MoeOffsets::take(int64_t n) {
  for (size_t i = 0; i < spare_.size(); ++i) {
    Copy& c = spare_[i];
    if (c.cap < n || cudaEventQuery(c.done) != cudaSuccess) continue;
    Copy got = c;
    spare_[i] = spare_.back();
    spare_.pop_back();
    (void)cudaGetLastError();  // a query that said "not ready" above leaves no error behind
    return got;
  }
  (void)cudaGetLastError();
  Copy c;
  c.cap = std::max<int64_t>(n, 64);
  CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&c.host), size_t(c.cap) * 4, cudaHostAllocPortable | cudaHostAllocMapped));
  CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&c.dev), c.host, 0));
  CUDA_CHECK(cudaEventCreateWithFlags(&c.done, cudaEventDisableTiming));
  return c;
}

void MoeOffsets::publish(const Tensor& offsets, cudaStream_t s, const std::function<void(int32_t*)>& write) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t n = offsets.numel();
  auto it = live_.find(offsets.data);
  if (it != live_.end() && it->second.cap < n) {  // too small for these offsets: back to the spares
    spare_.push_back(it->second);
    live_.erase(it);
    it = live_.end();
  }
  if (it == live_.end()) it = live_.emplace(offsets.data, take(n)).first;
  Copy& c = it->second;
  c.n = n;
  c.waited = false;
  write(c.dev);
  CUDA_CHECK(cudaEventRecord(c.done, s));  // the kernel's stores to host memory are visible when it completes
}

void MoeOffsets::read(const Tensor& offsets, cudaStream_t s, std::vector<int32_t>& out) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t n = offsets.numel();
  out.resize(size_t(n));
  auto it = live_.find(offsets.data);
  Copy* c = nullptr;
  if (it != live_.end() && it->second.n == n) {
    c = &it->second;
    if (!c->waited) {  // the one wait of this routing: on the copy's event only
      CUDA_CHECK(cudaEventSynchronize(c->done));
      c->waited = true;
    }
  } else {
    if (!fresh_.host || fresh_.cap < n) {
      if (fresh_.host) spare_.push_back(fresh_);
      fresh_ = take(n);
    }
    CUDA_CHECK(cudaMemcpyAsync(fresh_.host, offsets.data, size_t(n) * 4, cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaEventRecord(fresh_.done, s));
    CUDA_CHECK(cudaEventSynchronize(fresh_.done));
    c = &fresh_;
  }
  std::copy(c->host, c->host + n, out.begin());
}

void MoeOffsets::forget(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto* lo = static_cast<const char*>(p);
  for (auto it = live_.begin(); it != live_.end();) {
    const auto* q = static_cast<const char*>(it->first);
    if (q >= lo && q < lo + bytes) {
      spare_.push_back(it->second);
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
}

ExpertStreams::~ExpertStreams() {
  for (int i = 0; i < kStreams; ++i) {
    if (s_[i]) cudaStreamSynchronize(s_[i]), cudaStreamDestroy(s_[i]);
    if (join_[i]) cudaEventDestroy(join_[i]);
  }
  if (fork_) cudaEventDestroy(fork_);
}

ExpertStreams::Lanes::Lanes(ExpertStreams* owner, const Launch& L, int n) : base_(L) {
  if (!owner || !L.scratch || !L.scratch->lt_ws) return;
  // Every expert's GEMM runs on a kStreams-th of the workspace, however many streams it uses: the
  // plan (so the algorithm, so the bits) of a GEMM does not depend on how many experts have rows.
  const size_t slice = L.scratch->lt_bytes / kStreams / 256 * 256;
  for (int i = 0; i < kStreams; ++i)
    slices_[i] = Scratch{static_cast<char*>(L.scratch->lt_ws) + size_t(i) * slice, slice, nullptr, 0};
  lanes_[0] = L;
  lanes_[0].scratch = &slices_[0];
  if (n <= 1) return;  // one stream: the caller's
  o_ = owner;
  lk_ = std::unique_lock<std::mutex>(o_->mu_);
  n_ = std::min(n, kStreams);
  if (!o_->fork_) {  // first use: the streams and events, once
    CUDA_CHECK(cudaEventCreateWithFlags(&o_->fork_, cudaEventDisableTiming));
    for (int i = 0; i < kStreams; ++i) {
      CUDA_CHECK(cudaStreamCreateWithFlags(&o_->s_[i], cudaStreamNonBlocking));
      CUDA_CHECK(cudaEventCreateWithFlags(&o_->join_[i], cudaEventDisableTiming));
    }
  }
  CUDA_CHECK(cudaEventRecord(o_->fork_, L.stream));
  for (int i = 0; i < n_; ++i) {
    CUDA_CHECK(cudaStreamWaitEvent(o_->s_[i], o_->fork_, 0));
    lanes_[i] = L;
    lanes_[i].stream = o_->s_[i];
    lanes_[i].scratch = &slices_[i];
  }
}

ExpertStreams::Lanes::~Lanes() {
  if (!o_) return;
  for (int i = 0; i < n_; ++i) {  // no throw from a destructor: a failure here shows at the next check
    (void)cudaEventRecord(o_->join_[i], o_->s_[i]);
    (void)cudaStreamWaitEvent(base_.stream, o_->join_[i], 0);
  }
}

const Launch& ExpertStreams::Lanes::next() {
  if (!o_) return lanes_[0].scratch ? lanes_[0] : base_;
  const Launch& l = lanes_[i_];
  i_ = (i_ + 1) % n_;
  return l;
}

namespace {

// The size a GEMM plan is made for: the smallest of 2^j and 3 * 2^(j-1) (j >= 6) that holds n.
// A plan serves every row count up to it, so a run makes a few dozen plans, not one per count.
int64_t plan_size(int64_t n) {
  int64_t b = 64;
  while (b < n) {
    if (b / 2 * 3 >= n) return b / 2 * 3;
    b *= 2;
  }
  return b;
}

// Host offsets of `offsets` [E+1], checked as the cpu twin checks them (backend/cpu/moe.cpp).
void host_offsets(const char* op, const Tensor& offsets, int64_t M, const Launch& L, std::vector<int32_t>& off) {
  SF_CHECK(L.moe, std::string(op) + ": no MoE offsets cache in this launch");
  L.moe->read(offsets, L.stream, off);
  const size_t E = off.size() - 1;
  SF_CHECK(off[0] == 0 && off[E] <= M, std::string(op) + ": offsets do not cover the rows of the input");
  for (size_t e = 0; e < E; ++e)
    SF_CHECK(off[e] <= off[e + 1], std::string(op) + ": offsets decrease at expert " + std::to_string(e));
}

// Tests and benchmarks only (moe_gemm_force_one_stream); false in the program.
std::atomic<bool> g_one_stream{false};

// Streams for n experts with rows (one: all on the caller's).
int lanes_for(const std::vector<int32_t>& off) {
  int n = 0;
  for (size_t e = 0; e + 1 < off.size(); ++e) n += off[e + 1] > off[e];
  return g_one_stream.load() ? 1 : n;
}

// Element i of t's storage.
void* elem(const Tensor& t, int64_t i) { return static_cast<char*>(t.data) + size_t(i) * dtype_size(t.dtype); }

// One GEMM per expert with rows: make(e, r0, rows) gives expert e's, run on the plan of its size
// class (the rows are its M, or its K when rows_are_k), or on its own plan where that algorithm
// does not take its sizes.
template <class Make>
void each_expert(const char* op, const Tensor& offsets, int64_t M, bool rows_are_k, const Launch& L, Make make) {
  std::vector<int32_t> off;
  host_offsets(op, offsets, M, L, off);
  ExpertStreams::Lanes lanes(L.moe_streams, L, lanes_for(off));
  for (size_t e = 0; e + 1 < off.size(); ++e) {
    const int64_t r0 = off[e], rows = off[e + 1] - r0;
    if (rows == 0) continue;  // ops.h: nothing to write (wgrad: left as it is)
    const Gemm g = make(int64_t(e), r0, rows);
    const Launch& l = lanes.next();
    const int64_t size_class = plan_size(rows);
    if (!gemm_planned_as(g, rows_are_k ? g.M : size_class, g.N, rows_are_k ? size_class : g.K, l)) gemm(g, l);
  }
}

}  // namespace

void moe_gemm_force_one_stream(bool one) { g_one_stream = one; }

void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta, const Launch& L) {
  const int64_t Nout = out.cols(), K = a.cols(), stride = w.cols();
  if (out.rows() == 0 || Nout == 0) return;
  check_gemm_dtypes("moe_grouped_matmul", a.dtype, w.dtype, out.dtype);
  // out_e [rows, Nout] = a_e [rows, K] @ op(W_e) + beta out_e; W_e [Nout, K] (trans_w) or [K, Nout].
  each_expert("moe_grouped_matmul", offsets, out.rows(), false, L, [&](int64_t e, int64_t r0, int64_t rows) {
    return Gemm{.out = elem(out, r0 * Nout),
                .ot = out.dtype,
                .ldo = Nout,
                .a = elem(a, r0 * K),
                .at = a.dtype,
                .lda = K,
                .b = elem(w, e * stride),
                .bt = w.dtype,
                .ldb = trans_w ? K : Nout,
                .M = rows,
                .N = Nout,
                .K = K,
                .ta = false,
                .tb = trans_w,
                .alpha = 1.f,
                .beta = beta};
  });
}

void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, const Launch& L) {
  const int64_t Nout = dy.cols(), K = x.cols(), stride = dw.cols();
  if (Nout == 0 || K == 0 || dw.rows() == 0) return;
  check_gemm_dtypes("moe_grouped_matmul_wgrad", dy.dtype, x.dtype, dw.dtype);
  // dW_e [Nout, K] += dy_e^T [Nout, rows] @ x_e [rows, K]: the reduction runs over the rows.
  each_expert("moe_grouped_matmul_wgrad", offsets, dy.rows(), true, L, [&](int64_t e, int64_t r0, int64_t rows) {
    return Gemm{.out = elem(dw, e * stride),
                .ot = dw.dtype,
                .ldo = K,
                .a = elem(dy, r0 * Nout),
                .at = dy.dtype,
                .lda = Nout,
                .b = elem(x, r0 * K),
                .bt = x.dtype,
                .ldb = K,
                .M = Nout,
                .N = K,
                .K = rows,
                .ta = true,
                .tb = false,
                .alpha = 1.f,
                .beta = 1.f};
  });
}

}  // namespace sf::cuda
