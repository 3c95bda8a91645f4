// The cpu Device: streams (FIFO worker threads), events with CUDA semantics, host_fn, errors.
// Random per-task delays (CpuDeviceOptions::max_delay_us) shake out missing dependencies: a
// test that passes only because of lucky timing fails here within a few iterations.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <numeric>
#include <thread>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/kernels.h"
#include "test_util.h"

namespace sf {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Device> delayed_device(int max_delay_us, uint64_t seed = 7) {
  CpuDeviceOptions o;
  o.max_delay_us = max_delay_us;
  o.delay_seed = seed;
  return make_cpu_device(o);
}

// A gate a stream task can block on until the test opens it.
struct Gate {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  void open() { p.set_value(); }
};

TEST(CpuDevice, BasicsAndMemory) {
  auto dev = make_cpu_device();
  EXPECT_EQ(dev->name(), "cpu");
  EXPECT_TRUE(dev->is_host());
  DeviceBuffer b(*dev, 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 256, 0u);
  void* p = dev->alloc_pinned(77);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  dev->free_pinned(p);
  // A stream with nothing queued synchronizes at once; a fresh event counts as done.
  auto s = dev->create_stream();
  auto e = dev->create_event();
  dev->synchronize(*s);
  EXPECT_TRUE(dev->query(*e));
}

TEST(CpuDevice, FifoOrderWithinAStream) {
  auto dev = delayed_device(100);
  auto s = dev->create_stream();
  std::vector<int> seen;  // touched only by the stream's worker until synchronize
  std::vector<float> a(64, 0.f), b(64, 0.f);
  for (int i = 0; i < 300; ++i) {
    dev->host_fn(*s, [&seen, i] { seen.push_back(i); });
    if (i % 50 == 0) {
      // Copies and kernels are ordered with host functions: the check sees the copy's result.
      std::fill(a.begin(), a.end(), float(i));  // safe: the stream is drained below first
      dev->copy(b.data(), a.data(), a.size() * 4, CopyKind::DeviceToDevice, *s);
      dev->ops().scale(test::view_of(b, {64}), 2.f, *s);
      dev->host_fn(*s, [&b, i] {
        for (float v : b) ASSERT_EQ(v, 2.f * float(i));
      });
      dev->synchronize(*s);
    }
  }
  dev->synchronize(*s);
  std::vector<int> expect(300);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(seen, expect);
}

// Producer fills a shared buffer, consumer copies it out: the consumer waits for "filled", and
// the producer waits for "consumed" before overwriting (both directions of a real pipeline).
TEST(CpuDevice, RecordWaitAcrossStreamsUnderRandomDelays) {
  auto dev = delayed_device(200, 1234);
  auto prod = dev->create_stream(), cons = dev->create_stream();
  auto filled = dev->create_event(), consumed = dev->create_event();
  const int n = 257, iters = 400;
  std::vector<float> shared(n), ones(n, 1.f);
  std::vector<std::vector<float>> got(iters, std::vector<float>(n, -1.f));
  for (int it = 0; it < iters; ++it) {
    dev->wait(*prod, *consumed);  // the previous copy-out is done (no-op on the first iteration)
    dev->host_fn(*prod, [&shared, it] { std::fill(shared.begin(), shared.end(), float(it)); });
    dev->ops().add(test::view_of(shared, {n}), test::view_of(shared, {n}), test::view_of(ones, {n}), *prod);
    dev->record(*filled, *prod);
    dev->wait(*cons, *filled);
    dev->copy(got[it].data(), shared.data(), n * 4, CopyKind::DeviceToHost, *cons);
    dev->record(*consumed, *cons);
  }
  dev->synchronize(*prod);
  dev->synchronize(*cons);
  for (int it = 0; it < iters; ++it) {
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[it][i], float(it) + 1.f) << "iteration " << it;
  }
}

TEST(CpuDevice, WaitOnNeverRecordedEventIsANoOp) {
  auto dev = delayed_device(50);
  auto s = dev->create_stream();
  auto e = dev->create_event();
  std::atomic<bool> ran{false};
  dev->wait(*s, *e);
  dev->host_fn(*s, [&] { ran = true; });
  dev->synchronize(*s);
  EXPECT_TRUE(ran);
  dev->synchronize(*e);  // returns at once
  EXPECT_TRUE(dev->query(*e));
}

TEST(CpuDevice, SynchronizeAndQueryEventCoverOnlyWorkBeforeTheRecord) {
  auto dev = delayed_device(50);
  auto s = dev->create_stream();
  auto e = dev->create_event();
  Gate before, after;
  std::atomic<int> stage{0};
  dev->host_fn(*s, [&] {
    before.f.wait();
    stage = 1;
  });
  dev->record(*e, *s);
  dev->host_fn(*s, [&] {
    after.f.wait();  // work after the record: synchronize(e) must not wait for it
    stage = 2;
  });
  EXPECT_FALSE(dev->query(*e));
  before.open();
  auto sync = std::async(std::launch::async, [&] { dev->synchronize(*e); });
  ASSERT_EQ(sync.wait_for(10s), std::future_status::ready) << "synchronize(event) waited for later work";
  EXPECT_EQ(stage.load(), 1);
  EXPECT_TRUE(dev->query(*e));
  // Re-recording captures the new position: not done until the gated task finishes.
  dev->record(*e, *s);
  EXPECT_FALSE(dev->query(*e));
  after.open();
  dev->synchronize(*e);
  EXPECT_EQ(stage.load(), 2);
  EXPECT_TRUE(dev->query(*e));
  dev->synchronize(*s);
}

TEST(CpuDevice, WaitCapturesTheRecordAtTheTimeOfTheCall) {
  // Re-recording on the same stream after a wait was queued must not change what the wait waits
  // for: the consumer runs after the first record, not after the second (gated) one.
  auto dev = delayed_device(20);
  auto a = dev->create_stream(), c = dev->create_stream();
  auto e = dev->create_event();
  Gate gate;
  std::atomic<bool> consumer_ran{false};
  dev->record(*e, *a);
  dev->wait(*c, *e);
  dev->host_fn(*a, [&] { gate.f.wait(); });
  dev->record(*e, *a);
  dev->host_fn(*c, [&] { consumer_ran = true; });
  auto sync = std::async(std::launch::async, [&] { dev->synchronize(*c); });
  EXPECT_EQ(sync.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(consumer_ran);
  gate.open();
  sync.wait();
  dev->synchronize(*a);
}

// CUDA: cudaStreamWaitEvent waits for the work the event captured when the wait was issued,
// even if the event is recorded again later on another stream. The current CpuEvent keeps one
// "completed" counter, so a later record on a faster stream releases the earlier wait.
// Disabled until cpu_device.cpp tracks completion per record (reported).
TEST(CpuDevice, WaitIsNotReleasedByARecordOnAnotherStream) {
  auto dev = make_cpu_device();
  auto a = dev->create_stream(), b = dev->create_stream(), c = dev->create_stream();
  auto e = dev->create_event();
  Gate gate;
  std::atomic<bool> a_done{false};
  std::atomic<int> seen{-1};
  dev->host_fn(*a, [&] {
    gate.f.wait();
    a_done = true;
  });
  dev->record(*e, *a);
  dev->wait(*c, *e);
  dev->host_fn(*c, [&] { seen = a_done ? 1 : 0; });
  dev->record(*e, *b);  // completes at once
  std::this_thread::sleep_for(50ms);
  gate.open();
  dev->synchronize(*a);
  dev->synchronize(*b);
  dev->synchronize(*c);
  EXPECT_EQ(seen.load(), 1);
}

TEST(CpuDevice, ExceptionInATaskIsRethrownAtSynchronize) {
  auto dev = delayed_device(30);
  auto s = dev->create_stream();
  auto e = dev->create_event();
  std::vector<float> a(6), b(6), o(4), table(8), out(4);
  std::vector<int32_t> ids = {1, 7};  // the vocabulary is [0, 4)
  // A shape error is refused at the call by the front of the table (ops_check.h): nothing is queued.
  EXPECT_THROW(dev->ops().matmul(test::view_of(o, {2, 2}), test::view_of(a, {2, 3}), test::view_of(b, {2, 3}), false,
                                 false, 1.f, 0.f, *s),
               std::runtime_error);
  EXPECT_NO_THROW(dev->synchronize(*s));
  // An error only the data shows (a token id outside the vocabulary), inside a queued kernel:
  // nothing is thrown at the call, only at synchronize.
  EXPECT_NO_THROW(dev->ops().embedding_forward(test::view_of(out, {2, 2}), test::view_of(ids, {2}),
                                               test::view_of(table, {4, 2}), *s));
  std::atomic<bool> later_ran{false};
  dev->host_fn(*s, [&] { later_ran = true; });
  dev->record(*e, *s);
  try {
    dev->synchronize(*s);
    ADD_FAILURE() << "synchronize did not rethrow";
  } catch (const std::runtime_error& err) {
    EXPECT_NE(std::string(err.what()).find("embedding_forward: token id 7"), std::string::npos) << err.what();
  }
  // Later tasks and event completions still happened; the error is reported once.
  EXPECT_TRUE(later_ran);
  EXPECT_TRUE(dev->query(*e));
  EXPECT_NO_THROW(dev->synchronize(*s));
  // A throwing host function, likewise.
  dev->host_fn(*s, [] { throw std::runtime_error("boom from host_fn"); });
  EXPECT_THROW(dev->synchronize(*s), std::runtime_error);
  EXPECT_NO_THROW(dev->synchronize(*s));
}

TEST(CpuDevice, QueuedOpsMatchDirectKernelCalls) {
  // The Ops table only queues the cpu:: kernels: the same bits, later. Two streams at once.
  auto dev = delayed_device(100, 99);
  auto s1 = dev->create_stream(), s2 = dev->create_stream();
  const int N = 12, H = 16, V = 29;
  auto x = test::randn(size_t(N) * H, 1), w = test::randn(size_t(V) * H, 2), nw = test::randn(H, 3, 0.2f, 1.f);
  auto y = test::randint(N, 4, 0, V);
  std::vector<float> xn(x.size()), rstd(N), loss = {0.f}, dx(x.size()), dw(w.size(), 0.f), mm(size_t(N) * V);
  test::HostTensor ws(DType::F32, {int64_t(dev->ops().linear_ce_workspace_bytes(N, H, V) / 4) + 1});
  auto fin = dev->create_event();
  dev->ops().rmsnorm_forward(test::view_of(xn, {N, H}), test::view_of(rstd, {N}), test::view_of(x, {N, H}),
                             test::view_of(nw, {H}), 1e-6f, *s1);
  dev->record(*fin, *s1);
  dev->wait(*s2, *fin);
  dev->ops().linear_cross_entropy(test::view_of(loss, {1}), test::view_of(dx, {N, H}), test::view_of(dw, {V, H}),
                                  test::view_of(xn, {N, H}), test::view_of(w, {V, H}), test::view_of(y, {N}), 0.5f,
                                  ws.t(), *s2);
  dev->ops().matmul(test::view_of(mm, {N, V}), test::view_of(xn, {N, H}), test::view_of(w, {V, H}), false, true, 1.f,
                    0.f, *s1);
  dev->synchronize(*s1);
  dev->synchronize(*s2);
  std::vector<float> xn2(x.size()), rstd2(N), loss2 = {0.f}, dx2(x.size()), dw2(w.size(), 0.f), mm2(mm.size());
  cpu::rmsnorm_forward(test::view_of(xn2, {N, H}), test::view_of(rstd2, {N}), test::view_of(x, {N, H}),
                       test::view_of(nw, {H}), 1e-6f);
  cpu::linear_cross_entropy(test::view_of(loss2, {1}), test::view_of(dx2, {N, H}), test::view_of(dw2, {V, H}),
                            test::view_of(xn2, {N, H}), test::view_of(w, {V, H}), test::view_of(y, {N}), 0.5f, ws.t());
  cpu::matmul(test::view_of(mm2, {N, V}), test::view_of(xn2, {N, H}), test::view_of(w, {V, H}), false, true, 1.f, 0.f);
  EXPECT_EQ(xn, xn2);
  EXPECT_EQ(rstd, rstd2);
  EXPECT_EQ(loss, loss2);
  EXPECT_EQ(dx, dx2);
  EXPECT_EQ(dw, dw2);
  EXPECT_EQ(mm, mm2);
}

}  // namespace
}  // namespace sf
