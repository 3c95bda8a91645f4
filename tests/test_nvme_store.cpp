// The NVMe tier: the store's transfers (both backends, O_DIRECT or not, short transfers, disorder,
// injected errors), its anonymous file, and the sliding engine with AdamW state in the store:
// injected failures stop the run with the offload directory and the errno named, and state
// written and read tensor by tensor goes through the store. (The store against in-memory training
// bit for bit: tests/test_sliding_engine.cpp, the `_disk` cases.)
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "engine/sliding_engine.h"
#include "engine_state.h"
#include "io/nvme_store.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

// An aligned buffer for the asynchronous calls.
struct Aligned {
  std::vector<char> mem;
  char* p;
  explicit Aligned(size_t n) : mem(n + NvmeStore::kAlign) {
    p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mem.data()) + NvmeStore::kAlign - 1) /
                                NvmeStore::kAlign * NvmeStore::kAlign);
  }
};

// Waits for several done() calls.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  int left = 0;
  std::vector<int> errs;
  NvmeStore::Done done() {
    std::lock_guard<std::mutex> lk(mu);
    ++left;
    return [this](int err) {
      std::lock_guard<std::mutex> lk2(mu);
      errs.push_back(err);
      --left;
      cv.notify_all();
    };
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return left == 0; });
  }
};

struct StoreCase {
  bool uring, direct;
  StoreFaults faults;
  const char* name;
};

class StoreTransfers : public ::testing::TestWithParam<StoreCase> {};

// Many writes then reads in flight at once, pieces of odd multiples of the block: every byte back.
TEST_P(StoreTransfers, EveryByteComesBack) {
  const StoreCase c = GetParam();
  test::TempDir dir;
  StoreOptions o;
  o.dir = dir.path.string();
  o.bytes = 40 * NvmeStore::kAlign * 16;
  o.depth = 4;
  o.piece = 3 * NvmeStore::kAlign;
  o.uring = c.uring;
  o.direct = c.direct;
  o.faults = c.faults;
  NvmeStore s(o);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path)) << "the offload file has no name";
  std::mt19937 rng(3);
  const size_t region = 10 * NvmeStore::kAlign * 4;  // 4 regions
  Aligned src(4 * region), dst(4 * region);
  for (size_t i = 0; i < 4 * region; ++i) src.p[i] = char(rng());
  Waiter w;
  for (int r = 0; r < 4; ++r) s.write(uint64_t(r) * region, src.p + size_t(r) * region, region, w.done());
  w.wait();
  for (int r = 3; r >= 0; --r) s.read(uint64_t(r) * region, dst.p + size_t(r) * region, region, w.done());
  w.wait();
  for (int e : w.errs) EXPECT_EQ(e, 0);
  EXPECT_EQ(std::memcmp(src.p, dst.p, 4 * region), 0);
  EXPECT_EQ(s.bytes_written(), 4 * region);
  EXPECT_EQ(s.bytes_read(), 4 * region);
  EXPECT_GT(s.busy_seconds(), 0.0);
  // Unaligned synchronous transfers (read-modify-write at the edges) leave the rest as it was.
  std::vector<char> small(10001);
  for (char& ch : small) ch = char(rng());
  s.write_sync(777, small.data(), small.size());
  std::vector<char> back(small.size());
  s.read_sync(777, back.data(), back.size());
  EXPECT_EQ(back, small);
  std::vector<char> head(777);
  s.read_sync(0, head.data(), head.size());
  EXPECT_EQ(std::memcmp(head.data(), src.p, 777), 0);
  std::vector<char> after(5000);
  s.read_sync(777 + 10001, after.data(), after.size());
  EXPECT_EQ(std::memcmp(after.data(), src.p + 777 + 10001, after.size()), 0);
}

StoreFaults disorder() {
  StoreFaults f;
  f.max_delay_us = 300;
  f.short_transfers = true;
  return f;
}

INSTANTIATE_TEST_SUITE_P(Store, StoreTransfers,
                         ::testing::Values(StoreCase{true, true, {}, "uring_direct"},
                                           StoreCase{false, true, {}, "threads_direct"},
                                           StoreCase{true, false, {}, "uring_cached"},
                                           StoreCase{false, false, {}, "threads_cached"},
                                           StoreCase{true, true, disorder(), "uring_disorder"},
                                           StoreCase{false, true, disorder(), "threads_disorder"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Store, InjectedErrorsReachDone) {
  test::TempDir dir;
  for (const bool uring : {true, false})
    for (const int err : {EIO, ENOSPC})
      for (const bool reads : {false, true}) {
        SCOPED_TRACE(std::string(uring ? "uring " : "threads ") + std::strerror(err) + (reads ? " reads" : " writes"));
        StoreOptions o;
        o.dir = dir.path.string();
        o.bytes = 64 * NvmeStore::kAlign;
        o.piece = NvmeStore::kAlign;
        o.uring = uring;
        o.faults.fail_errno = err;
        o.faults.fail_reads = reads;
        o.faults.fail_after_bytes = 5 * NvmeStore::kAlign;
        NvmeStore s(o);
        Aligned b(16 * NvmeStore::kAlign);
        Waiter w;
        s.write(0, b.p, 16 * NvmeStore::kAlign, w.done());
        w.wait();
        s.read(0, b.p, 16 * NvmeStore::kAlign, w.done());
        w.wait();
        ASSERT_EQ(w.errs.size(), 2u);
        EXPECT_EQ(w.errs[reads ? 1 : 0], err);
        EXPECT_EQ(w.errs[reads ? 0 : 1], 0);
        std::vector<char> x(100);
        if (reads) {
          try {
            s.read_sync(0, x.data(), x.size());
            ADD_FAILURE() << "no error";
          } catch (const std::runtime_error& e) {
            EXPECT_NE(std::string(e.what()).find(o.dir), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(std::strerror(err)), std::string::npos) << e.what();
          }
        }
      }
}

TEST(Store, BadDirectoriesAndTooLargeFilesAreInputErrors) {
  test::TempDir dir;
  StoreOptions o;
  o.dir = (dir.path / "missing").string();
  o.bytes = NvmeStore::kAlign;
  test::expect_input_error([&] { NvmeStore s(o); }, {"missing", "offload"});
  const std::string file = dir.file("f");
  { std::ofstream(file) << "x"; }
  o.dir = file;
  test::expect_input_error([&] { NvmeStore s(o); }, {"not a directory"});
  o.dir = dir.path.string();
  o.bytes = uint64_t(1) << 60;  // more than any disk here
  test::expect_input_error([&] { NvmeStore s(o); }, {"cannot reserve", "free"});
  EXPECT_TRUE(std::filesystem::is_empty(dir.path) || std::filesystem::exists(file));
}

// ---- the engine with state in the store

std::vector<Batch> some_batches(const ModelSpec& spec, std::vector<Record>& keep) {
  std::mt19937_64 rng(9);
  keep.clear();
  for (int i = 0; i < 4; ++i) {
    Record r;
    for (int t = 0; t < 9; ++t) r.ids.push_back(int32_t(rng() % uint64_t(spec.vocab)));
    r.labels = r.ids;
    keep.push_back(r);
  }
  return {make_batch({&keep[0], &keep[1]}, 9), make_batch({&keep[2], &keep[3]}, 9)};
}

// A read or a write of the store that fails stops the run at the next step (or at the
// synchronisation of a save) with the directory and the errno, never silently.
TEST(NvmeTier, AFailedTransferStopsTheRun) {
  ModelSpec spec = parse_model_spec(test::tiny_config("llama"), "tiny");
  for (const bool reads : {false, true})
    for (const bool clip : {false, true}) {
      SCOPED_TRACE(std::string(reads ? "reads" : "writes") + (clip ? ", clipping" : ""));
      test::TempDir dir;
      auto dev = make_cpu_device();
      SlidingOptions so;
      so.base.max_batch = 2;
      so.base.max_seq = 9;
      so.keep_grads = clip;
      for (int b = 1; b <= spec.n_layer; ++b) so.disk_blobs.push_back(b);
      so.store.dir = dir.path.string();
      so.store.faults.fail_errno = EIO;
      so.store.faults.fail_reads = reads;
      so.store.faults.fail_after_bytes = 1;
      std::vector<Record> recs;
      const std::vector<Batch> mbs = some_batches(spec, recs);
      SlidingEngine e(*dev, spec, so);
      e.init_random(1);
      Engine::StepParams p;
      p.adamw.lr = 1e-3f;
      p.max_grad_norm = clip ? 1.0 : 0.0;
      std::string what;
      try {
        for (int s = 1; s <= 3; ++s) {
          p.adamw.step = s;
          e.step({mbs[0]}, p);
        }
        e.synchronize();
      } catch (const std::runtime_error& err) {
        what = err.what();
      }
      EXPECT_NE(what.find(dir.path.string()), std::string::npos) << what;
      EXPECT_NE(what.find(std::strerror(EIO)), std::string::npos) << what;
    }
}

// State written and read tensor by tensor (save / resume) goes to and from the store, and an
// engine resumed so continues exactly as the one it was saved from; with AdamW state there (level
// 2), the fp32 masters too (3: the working copy written with them), the working copies too (4) and
// the held gradients too (5).
class NvmeTierLevels : public ::testing::TestWithParam<int> {};
TEST_P(NvmeTierLevels, StateWrittenAndReadThroughTheStore) {
  const int level = GetParam();
  ModelSpec spec = parse_model_spec(test::tiny_config("qwen3"), "tiny");
  const ModelLayout layout = make_layout(spec);
  test::TempDir dir;
  auto dev = make_cpu_device();
  SlidingOptions so;
  so.base.max_batch = 2;
  so.base.max_seq = 9;
  so.base.compute_dtype = "bf16";  // a working copy half a master
  for (int b = 0; b <= spec.n_layer + 1; ++b) so.disk_blobs.push_back(b);
  if (level >= 3) so.disk_masters = so.disk_blobs;
  if (level >= 4) so.disk_weights = so.disk_blobs;
  if (level >= 5) so.disk_grads = so.disk_blobs;  // the held gradients too (clipping)
  so.store.dir = dir.path.string();
  SlidingOptions ram = so;
  ram.disk_blobs.clear();
  ram.disk_masters.clear();
  ram.disk_weights.clear();
  ram.disk_grads.clear();
  std::vector<Record> recs;
  const std::vector<Batch> mbs = some_batches(spec, recs);
  Engine::StepParams p;
  p.adamw.lr = 1e-2f;
  p.max_grad_norm = 1.0;
  SlidingEngine a(*dev, spec, so), b(*dev, spec, so), c(*dev, spec, ram);
  a.init_random(4);
  for (int s = 1; s <= 2; ++s) {
    p.adamw.step = s;
    a.step({mbs[size_t(s % 2)]}, p);
  }
  b.init_random(5);
  c.init_random(6);
  for (auto which : {Engine::State::Params, Engine::State::AdamM, Engine::State::AdamV}) {
    const auto ref = test::export_state(a, which);
    size_t k = 0;
    for (size_t bl = 0; bl < layout.blobs.size(); ++bl)
      for (size_t i = 0; i < layout.blobs[bl].entries.size(); ++i, ++k) {
        b.write_state(which, int(bl), int(i), ref[k].data.data());
        c.write_state(which, int(bl), int(i), ref[k].data.data());
      }
    const auto got = test::export_state(b, which);
    for (size_t t = 0; t < ref.size(); ++t) EXPECT_EQ(got[t].data, ref[t].data) << ref[t].name;
    bool moved = false;
    for (const auto& t : ref)
      for (float x : t.data) moved |= which != Engine::State::Params && x != 0.f;
    if (which != Engine::State::Params) {
      EXPECT_TRUE(moved) << "the moments were not trained";
    }
  }
  for (Engine* e : {&a, &b, &c}) {
    p.adamw.step = 3;
    e->step({mbs[0]}, p);
  }
  const auto pa = test::export_state(a, Engine::State::Params), pb = test::export_state(b, Engine::State::Params),
             pc = test::export_state(c, Engine::State::Params);
  for (size_t t = 0; t < pa.size(); ++t) {
    EXPECT_EQ(pa[t].data, pb[t].data) << pa[t].name;
    EXPECT_EQ(pa[t].data, pc[t].data) << pa[t].name;
  }
  EXPECT_GT(a.stats().disk_read, 0u);
  EXPECT_GT(a.stats().disk_written, 0u);
}
INSTANTIATE_TEST_SUITE_P(NvmeTier, NvmeTierLevels, ::testing::Values(2, 3, 4, 5));

}  // namespace
}  // namespace sf
