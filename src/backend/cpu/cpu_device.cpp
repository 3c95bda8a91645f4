#include "backend/cpu/cpu_device.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "backend/cpu/kernels.h"
#include "backend/ops_check.h"
#include "core/align.h"
#include "core/error.h"

namespace sf {
namespace {

// Each record() makes a new completion flag; the stream sets it when it reaches that point.
// A wait() captures the flag of the most recent record at the time of the call, so a later
// record (even on a faster stream) cannot release it early: CUDA's semantics.
struct RecordFlag {
  bool done = false;
};

struct CpuEvent : Event {
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<RecordFlag> latest;          // null until the first record
  std::chrono::steady_clock::time_point when;  // the last completion (timing events)

  void complete(const std::shared_ptr<RecordFlag>& f) {
    {
      std::lock_guard<std::mutex> lk(mu);
      f->done = true;
      when = std::chrono::steady_clock::now();
    }
    cv.notify_all();
  }
  void wait_for(const std::shared_ptr<RecordFlag>& f) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return f->done; });
  }
  std::shared_ptr<RecordFlag> current() {
    std::lock_guard<std::mutex> lk(mu);
    return latest;
  }
};

struct CpuStream : Stream {
  std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<std::function<void()>> queue;
  bool busy = false, stop = false;
  std::exception_ptr error;  // first task failure; rethrown at synchronize
  std::thread worker;
  std::mt19937_64 rng;
  CpuDeviceOptions delays;

  bool stalls;

  CpuStream(const CpuDeviceOptions& o, uint64_t seed, int index)
      : rng(seed), delays(o), stalls(index < 64 && ((o.stall_streams >> index) & 1)) {
    worker = std::thread([this] { run(); });
  }
  ~CpuStream() override {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void push(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lk(mu);
      queue.push_back(std::move(fn));
    }
    cv.notify_one();
  }
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop and drained
        fn = std::move(queue.front());
        queue.pop_front();
        busy = true;
      }
      if (delays.max_delay_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % (uint64_t(delays.max_delay_us) + 1)));
      }
      if (stalls && delays.stall_every > 0 && rng() % uint64_t(delays.stall_every) == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(delays.stall_us));
      }
      try {
        fn();  // even after a failure, so that event completions still happen
      } catch (...) {
        if (!error) error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(mu);
        busy = false;
      }
      idle_cv.notify_all();
    }
  }
  void drain() {
    std::unique_lock<std::mutex> lk(mu);
    idle_cv.wait(lk, [&] { return queue.empty() && !busy; });
    if (error) {
      auto e = error;
      error = nullptr;
      std::rethrow_exception(e);
    }
  }
};

CpuStream& cs(Stream& s) { return static_cast<CpuStream&>(s); }
CpuEvent& ce(Event& e) { return static_cast<CpuEvent&>(e); }

// The kernel table: each call is queued on the stream's worker. The device hands it out behind
// the checking front (ops_check.h), so the arguments are checked on the caller's thread.
class CpuOps final : public Ops {
 public:
  void matmul(Tensor out, Tensor a, Tensor b, bool ta, bool tb, float alpha, float beta, Stream& s) override {
    cs(s).push([=] { cpu::matmul(out, a, b, ta, tb, alpha, beta); });
  }
  void add_bias(Tensor out, Tensor bias, Stream& s) override {
    cs(s).push([=] { cpu::add_bias(out, bias); });
  }
  void bias_backward(Tensor dbias, Tensor dout, Stream& s) override {
    cs(s).push([=] { cpu::bias_backward(dbias, dout); });
  }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    cs(s).push([=] { cpu::rmsnorm_forward(out, rstd, x, w, eps); });
  }
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                        Stream& s) override {
    cs(s).push([=] { cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, acc); });
  }
  void rmsnorm_1p_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, float eps, Stream& s) override {
    cs(s).push([=] { cpu::rmsnorm_forward(out, rstd, x, w, eps, 1.f); });
  }
  void rmsnorm_1p_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, bool acc,
                           Stream& s) override {
    cs(s).push([=] { cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, acc, 1.f); });
  }
  void rope_forward(Tensor x, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    cs(s).push([=] { cpu::rope_forward(x, cos, sin, T, nh, hd, pos); });
  }
  void rope_backward(Tensor dx, Tensor cos, Tensor sin, int T, int nh, int hd, Tensor pos, Stream& s) override {
    cs(s).push([=] { cpu::rope_backward(dx, cos, sin, T, nh, hd, pos); });
  }
  void swiglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    cs(s).push([=] { cpu::swiglu_forward(out, gate, up); });
  }
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    cs(s).push([=] { cpu::swiglu_backward(dgate, dup, dout, gate, up); });
  }
  void geglu_forward(Tensor out, Tensor gate, Tensor up, Stream& s) override {
    cs(s).push([=] { cpu::geglu_forward(out, gate, up); });
  }
  void geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up, Stream& s) override {
    cs(s).push([=] { cpu::geglu_backward(dgate, dup, dout, gate, up); });
  }
  void moe_route(Tensor probs, Tensor idx, Tensor weights, Tensor stats, Tensor logits, bool renorm,
                 Stream& s) override {
    cs(s).push([=] { cpu::moe_route(probs, idx, weights, stats, logits, renorm); });
  }
  void moe_route_backward(Tensor dlogits, Tensor dweights, Tensor probs, Tensor idx, bool renorm, Tensor counts,
                          float aux_scale, Stream& s) override {
    cs(s).push([=] { cpu::moe_route_backward(dlogits, dweights, probs, idx, renorm, counts, aux_scale); });
  }
  void moe_permute(Tensor offsets, Tensor sorted_slot, Tensor slot_pos, Tensor idx, Stream& s) override {
    cs(s).push([=] { cpu::moe_permute(offsets, sorted_slot, slot_pos, idx); });
  }
  void moe_gather(Tensor xs, Tensor x, Tensor sorted_slot, int k, Stream& s) override {
    cs(s).push([=] { cpu::moe_gather(xs, x, sorted_slot, k); });
  }
  void moe_gather_backward(Tensor dx, Tensor dxs, Tensor slot_pos, int k, Stream& s) override {
    cs(s).push([=] { cpu::moe_gather_backward(dx, dxs, slot_pos, k); });
  }
  void moe_grouped_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, bool trans_w, float beta,
                          Stream& s) override {
    cs(s).push([=] { cpu::moe_grouped_matmul(out, a, w, offsets, trans_w, beta); });
  }
  void moe_grouped_matmul_wgrad(Tensor dw, Tensor dy, Tensor x, Tensor offsets, Stream& s) override {
    cs(s).push([=] { cpu::moe_grouped_matmul_wgrad(dw, dy, x, offsets); });
  }
  void moe_combine(Tensor y, Tensor ys, Tensor weights, Tensor slot_pos, Stream& s) override {
    cs(s).push([=] { cpu::moe_combine(y, ys, weights, slot_pos); });
  }
  void moe_combine_backward(Tensor dys, Tensor dweights, Tensor dy, Tensor ys, Tensor weights, Tensor slot_pos,
                            Stream& s) override {
    cs(s).push([=] { cpu::moe_combine_backward(dys, dweights, dy, ys, weights, slot_pos); });
  }
  void moe_aux_loss(Tensor loss_sum, Tensor stats, float scale, Stream& s) override {
    cs(s).push([=] { cpu::moe_aux_loss(loss_sum, stats, scale); });
  }
  void moe_expert_scale(Tensor out, Tensor w, Tensor idx, Tensor scale, Stream& s) override {
    cs(s).push([=] { cpu::moe_expert_scale(out, w, idx, scale); });
  }
  void moe_expert_scale_backward(Tensor dw, Tensor dscale, Tensor dout, Tensor w, Tensor idx, Tensor scale,
                                 Stream& s) override {
    cs(s).push([=] { cpu::moe_expert_scale_backward(dw, dscale, dout, w, idx, scale); });
  }
  void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttnDims& d, Stream& s) override {
    cs(s).push([=] { cpu::attention_forward(out, lse, q, k, v, d); });
  }
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                          Tensor lse, const AttnDims& d, Tensor ws, Stream& s) override {
    cs(s).push([=] { cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d, ws); });
  }
  size_t attention_workspace_bytes(const AttnDims& d) const override { return cpu::attention_workspace_bytes(d); }
  void linear_cross_entropy(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                            Tensor ws, Stream& s) override {
    cs(s).push([=] { cpu::linear_cross_entropy(loss_sum, dx, dw, x, w, labels, gs, ws); });
  }
  size_t linear_ce_workspace_bytes(int64_t N, int64_t H, int64_t V) const override {
    return cpu::linear_ce_workspace_bytes(N, H, V);
  }
  void linear_cross_entropy_capped(Tensor loss_sum, Tensor dx, Tensor dw, Tensor x, Tensor w, Tensor labels, float gs,
                                   float cap, Tensor ws, Stream& s) override {
    cs(s).push([=] { cpu::linear_cross_entropy(loss_sum, dx, dw, x, w, labels, gs, ws, cap); });
  }
  void matmul_add(Tensor out, Tensor a, Tensor b, bool ta, bool tb, Tensor c, Stream& s) override {
    cs(s).push([=] { cpu::matmul_add(out, a, b, ta, tb, c); });
  }
  void embedding_forward(Tensor out, Tensor ids, Tensor table, Stream& s) override {
    cs(s).push([=] { cpu::embedding_forward(out, ids, table); });
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids, Stream& s) override {
    cs(s).push([=] { cpu::embedding_backward(dtable, dout, ids); });
  }
  void ids_or_zero(Tensor out, Tensor ids, int64_t limit, Stream& s) override {
    cs(s).push([=] { cpu::ids_or_zero(out, ids, limit); });
  }
  void add(Tensor out, Tensor a, Tensor b, Stream& s) override {
    cs(s).push([=] { cpu::add(out, a, b); });
  }
  void scale(Tensor x, float alpha, Stream& s) override {
    cs(s).push([=] { cpu::scale(x, alpha); });
  }
  void cast(Tensor out, Tensor in, Stream& s) override {
    cs(s).push([=] { cpu::cast(out, in); });
  }
  void zero(Tensor x, Stream& s) override {
    cs(s).push([=] { cpu::zero(x); });
  }
  void sq_norm(Tensor out, Tensor x, Stream& s) override {
    cs(s).push([=] { cpu::sq_norm(out, x); });
  }
  void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor copy, const AdamWParams& p, Stream& s) override {
    cs(s).push([=] { cpu::adamw(param, grad, m, v, copy, p); });
  }
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& opt) : opt_(opt) {}
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }

  void* alloc(size_t bytes) override {
    void* p = std::aligned_alloc(256, round256(bytes));
    if (!p) throw std::bad_alloc();
    return p;
  }
  void free(void* p) override { std::free(p); }
  void* alloc_pinned(size_t bytes) override { return alloc(bytes); }
  void free_pinned(void* p) override { std::free(p); }

  std::unique_ptr<Stream> create_stream() override {
    const uint64_t n = streams_++;
    return std::make_unique<CpuStream>(opt_, opt_.delay_seed + 0x9e3779b97f4a7c15ull * (n + 1), int(n));
  }
  std::unique_ptr<Event> create_event() override { return std::make_unique<CpuEvent>(); }
  std::unique_ptr<Event> create_timing_event() override { return std::make_unique<CpuEvent>(); }
  double elapsed_seconds(Event& from, Event& to) override {
    std::chrono::steady_clock::time_point a, b;
    {
      std::lock_guard<std::mutex> lk(ce(from).mu);
      a = ce(from).when;
    }
    {
      std::lock_guard<std::mutex> lk(ce(to).mu);
      b = ce(to).when;
    }
    return std::chrono::duration<double>(b - a).count();
  }

  void record(Event& e, Stream& s) override {
    CpuEvent* ev = &ce(e);
    auto flag = std::make_shared<RecordFlag>();
    {
      std::lock_guard<std::mutex> lk(ev->mu);
      ev->latest = flag;
    }
    cs(s).push([ev, flag] { ev->complete(flag); });
  }
  void wait(Stream& s, Event& e) override {
    CpuEvent* ev = &ce(e);
    auto flag = ev->current();  // the most recent record at the time of the call
    if (!flag) return;
    cs(s).push([ev, flag] { ev->wait_for(flag); });
  }
  void synchronize(Event& e) override {
    CpuEvent& ev = ce(e);
    if (auto flag = ev.current()) ev.wait_for(flag);
  }
  void synchronize(Stream& s) override { cs(s).drain(); }
  bool query(Event& e) override {
    CpuEvent& ev = ce(e);
    std::lock_guard<std::mutex> lk(ev.mu);
    return !ev.latest || ev.latest->done;
  }
  void copy(void* dst, const void* src, size_t bytes, CopyKind, Stream& s) override {
    cs(s).push([=] { std::memcpy(dst, src, bytes); });
  }
  void host_fn(Stream& s, std::function<void()> fn) override { cs(s).push(std::move(fn)); }
  Ops& ops() override { return checked_; }

 private:
  CpuDeviceOptions opt_;
  CpuOps ops_;
  CheckedOps checked_{ops_};
  std::atomic<uint64_t> streams_{0};
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(const CpuDeviceOptions& opt) { return std::make_unique<CpuDevice>(opt); }
std::unique_ptr<Device> make_cpu_device() { return make_cpu_device(CpuDeviceOptions{}); }

}  // namespace sf
