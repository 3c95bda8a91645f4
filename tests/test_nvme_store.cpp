// The NVMe tier: the store's transfers (both backends, O_DIRECT or not, short transfers, disorder,
// injected errors), its anonymous file, and the sliding engine with AdamW state in the store:
// injected failures stop the run with the offload directory and the errno named, and state
// written and read tensor by tensor goes through the store. (The store against in-memory training
// bit for bit: tests/test_sliding_engine.cpp, the `_disk` cases.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "engine/planner.h"
#include "engine/sliding_engine.h"
#include "engine/slot_cache.h"
#include "engine/state_stream.h"
#include "engine/weight_stream.h"
#include "engine_state.h"
#include "io/gds.h"
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
  bool fixed = false;  // the buffers registered with io_uring (READ_FIXED / WRITE_FIXED)
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
  // Registered: the source whole; the destination's first half only (the rest goes plain).
  RegisteredBuffer rs, rd;
  if (c.fixed) {
    rs = RegisteredBuffer(&s, src.p, 4 * region);
    rd = RegisteredBuffer(&s, dst.p, 2 * region);
    EXPECT_EQ(rs.registered(), s.how().rfind("io_uring", 0) == 0) << s.how();
    EXPECT_EQ(rd.registered(), rs.registered());
  }
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
  if (c.fixed && rs.registered()) {
    // 4 regions of 3.33 pieces written, 2 regions read into the registered half (+ resubmissions).
    EXPECT_GE(s.fixed_pieces(), uint64_t(4 * 4 + 2 * 4));
  } else {
    EXPECT_EQ(s.fixed_pieces(), 0u);
  }
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
                                           StoreCase{false, true, disorder(), "threads_disorder"},
                                           StoreCase{true, true, {}, "uring_direct_fixed", true},
                                           StoreCase{true, false, disorder(), "uring_disorder_fixed", true},
                                           StoreCase{false, true, {}, "threads_fixed", true}),
                         [](const auto& info) { return std::string(info.param.name); });

// A blocking transfer (a stream's host function waits in it, and with it every other stream's host
// functions on CUDA's one thread) goes ahead of the asynchronous read-ahead queued before it: it
// waits for the pieces in flight, not for the backlog.
TEST(Store, BlockingTransfersPassTheQueuedReadAhead) {
  test::TempDir dir;
  for (const bool uring : {true, false}) {
    SCOPED_TRACE(uring ? "uring" : "threads");
    StoreOptions o;
    o.dir = dir.path.string();
    o.bytes = 80 * NvmeStore::kAlign;
    o.depth = 2;
    o.piece = NvmeStore::kAlign;
    o.uring = uring;
    o.faults.max_delay_us = 3000;  // each piece takes up to 3 ms: the backlog of 64 about 100 ms
    NvmeStore s(o);
    const int backlog = 64;
    Aligned rd(size_t(backlog) * NvmeStore::kAlign), wr(NvmeStore::kAlign);
    std::memset(wr.p, 0x5a, NvmeStore::kAlign);
    // A run tells only if the backlog is still queued when the write is issued: this thread
    // descheduled for ~50 ms between the reads and the write (a loaded 2-core machine under TSan)
    // lets the reads drain first, and the write then passes nothing. Such a run is done again.
    bool told = false;
    for (int attempt = 0; attempt < 4 && !told; ++attempt) {
      std::atomic<int> reads_done{0};
      Waiter w;
      for (int i = 0; i < backlog; ++i) {  // one request a piece, each counted as it completes
        NvmeStore::Done d = w.done();
        s.read(uint64_t(i) * NvmeStore::kAlign, rd.p + size_t(i) * NvmeStore::kAlign, NvmeStore::kAlign,
               [&reads_done, d](int err) {
                 ++reads_done;
                 d(err);
               });
      }
      const int at_issue = reads_done.load();
      s.write_wait(uint64_t(backlog + 1) * NvmeStore::kAlign, wr.p, NvmeStore::kAlign);
      const int during = reads_done.load() - at_issue;
      w.wait();
      for (int e : w.errs) EXPECT_EQ(e, 0);
      if (at_issue > backlog / 2) continue;
      told = true;
      // Issued once one of the `depth` pieces in flight completes; a few more may complete
      // meanwhile (2 x depth + 2 on an idle machine; 9 seen under TSan beside a build): far fewer
      // than the backlog left, which a write queued behind the reads would wait for whole.
      EXPECT_LT(during, backlog / 4) << "the blocking write waited behind the queued reads (" << at_issue
                                     << " done when it was issued)";
    }
    if (!told) GTEST_SKIP() << "the reads drained before the write was issued in every attempt (machine too loaded)";
    std::vector<char> back(NvmeStore::kAlign);
    s.read_sync(uint64_t(backlog + 1) * NvmeStore::kAlign, back.data(), back.size());
    EXPECT_EQ(std::memcmp(back.data(), wr.p, back.size()), 0);
  }
}

TEST(Store, InjectedErrorsReachDone) {
  test::TempDir dir;
  for (const bool uring : {true, false})
   for (const bool fixed : {false, true})
    for (const int err : {EIO, ENOSPC})
      for (const bool reads : {false, true}) {
        if (fixed && !uring) continue;
        SCOPED_TRACE(std::string(uring ? "uring " : "threads ") + (fixed ? "registered " : "") + std::strerror(err) +
                     (reads ? " reads" : " writes"));
        StoreOptions o;
        o.dir = dir.path.string();
        o.bytes = 64 * NvmeStore::kAlign;
        o.piece = NvmeStore::kAlign;
        o.uring = uring;
        o.faults.fail_errno = err;
        o.faults.fail_reads = reads;
        o.faults.fail_after_bytes = 5 * NvmeStore::kAlign;
        o.faults.short_transfers = fixed;  // a registered piece cut short resumes inside its buffer
        if (fixed) o.piece = 2 * NvmeStore::kAlign;
        NvmeStore s(o);
        Aligned b(16 * NvmeStore::kAlign);
        const RegisteredBuffer reg(fixed ? &s : nullptr, b.p, 16 * NvmeStore::kAlign);
        EXPECT_EQ(reg.registered(), fixed && s.how().rfind("io_uring", 0) == 0);
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

// A store of 64 blocks in `dir`, moved in pieces of `piece_blocks` blocks.
StoreOptions small_store(const test::TempDir& dir, size_t piece_blocks) {
  StoreOptions o;
  o.dir = dir.path.string();
  o.bytes = 64 * NvmeStore::kAlign;
  o.piece = piece_blocks * NvmeStore::kAlign;
  return o;
}

// The kernel refuses to register (past RLIMIT_MEMLOCK): said once in the log, no more attempts,
// and the transfers go on as plain reads and writes with every byte and every fault as before.
TEST(Store, RefusedRegistrationFallsBackOnce) {
  test::TempDir dir;
  StoreOptions o = small_store(dir, 2);
  o.faults.refuse_registration = true;
  o.faults.short_transfers = true;
  o.faults.max_delay_us = 100;
  NvmeStore s(o);
  if (s.how().rfind("io_uring", 0) != 0) GTEST_SKIP() << "no io_uring here: " << s.how();
  Aligned a(32 * NvmeStore::kAlign), b(32 * NvmeStore::kAlign);
  std::mt19937 rng(5);
  for (size_t i = 0; i < 32 * NvmeStore::kAlign; ++i) a.p[i] = char(rng());
  ::testing::internal::CaptureStderr();
  const RegisteredBuffer ra(&s, a.p, 32 * NvmeStore::kAlign), rb(&s, b.p, 32 * NvmeStore::kAlign);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(ra.registered());
  EXPECT_FALSE(rb.registered());
  size_t said = 0;
  for (size_t at = log.find("did not register"); at != std::string::npos; at = log.find("did not register", at + 1))
    ++said;
  EXPECT_EQ(said, 1u) << log;
  EXPECT_NE(log.find(o.dir), std::string::npos) << log;
  EXPECT_NE(log.find("locked-memory limit"), std::string::npos) << log;
  s.write_wait(0, a.p, 32 * NvmeStore::kAlign);
  s.read_wait(0, b.p, 32 * NvmeStore::kAlign);
  EXPECT_EQ(std::memcmp(a.p, b.p, 32 * NvmeStore::kAlign), 0);
  EXPECT_EQ(s.fixed_pieces(), 0u);
}

// Buffers registered and unregistered in any order (parts of an engine come and go): the table
// keeps the others, and a piece straddling a registered buffer's end goes plain.
TEST(Store, RegisteredBuffersComeAndGo) {
  test::TempDir dir;
  NvmeStore s(small_store(dir, 4));
  if (s.how().rfind("io_uring", 0) != 0) GTEST_SKIP() << "no io_uring here: " << s.how();
  Aligned a(16 * NvmeStore::kAlign), b(16 * NvmeStore::kAlign), c(16 * NvmeStore::kAlign);
  for (size_t i = 0; i < 16 * NvmeStore::kAlign; ++i) a.p[i] = char(i * 7 + 1);
  auto ra = std::make_unique<RegisteredBuffer>(&s, a.p, 16 * NvmeStore::kAlign);
  const RegisteredBuffer rb(&s, b.p, 6 * NvmeStore::kAlign);  // pieces of 4 blocks: [0, 4) fixed, [4, 8) plain
  ASSERT_TRUE(ra->registered() && rb.registered());
  s.write_wait(0, a.p, 16 * NvmeStore::kAlign);
  EXPECT_EQ(s.fixed_pieces(), 4u);
  ra.reset();  // a's entries leave the table; b's stay
  s.write_wait(16 * NvmeStore::kAlign, a.p, 16 * NvmeStore::kAlign);
  EXPECT_EQ(s.fixed_pieces(), 4u);
  s.read_wait(0, b.p, 8 * NvmeStore::kAlign);
  EXPECT_EQ(s.fixed_pieces(), 5u);
  EXPECT_EQ(std::memcmp(a.p, b.p, 8 * NvmeStore::kAlign), 0);
  const RegisteredBuffer rc(&s, c.p, 16 * NvmeStore::kAlign);
  ASSERT_TRUE(rc.registered());
  s.read_wait(16 * NvmeStore::kAlign, c.p, 16 * NvmeStore::kAlign);
  EXPECT_EQ(s.fixed_pieces(), 9u);
  EXPECT_NE(s.how().find(", 2 registered buffers"), std::string::npos) << s.how();
  EXPECT_EQ(std::memcmp(a.p, c.p, 16 * NvmeStore::kAlign), 0);
}

// Buffers registered and unregistered while another thread's transfers run (pieces held back
// while the table changes, the reaper out of the kernel): every byte comes back, nothing hangs.
TEST(Store, RegistrationWhileTransfersRun) {
  test::TempDir dir;
  StoreOptions o = small_store(dir, 1);
  o.faults.max_delay_us = 200;
  NvmeStore s(o);
  if (s.how().rfind("io_uring", 0) != 0) GTEST_SKIP() << "no io_uring here: " << s.how();
  Aligned a(16 * NvmeStore::kAlign), b(16 * NvmeStore::kAlign), c(8 * NvmeStore::kAlign);
  for (size_t i = 0; i < 16 * NvmeStore::kAlign; ++i) a.p[i] = char(i * 13 + 5);
  std::atomic<bool> done{false};
  int rounds = 0;
  std::thread io([&] {
    for (; rounds < 30; ++rounds) {
      s.write_wait(uint64_t(rounds % 4) * 16 * NvmeStore::kAlign, a.p, 16 * NvmeStore::kAlign);
      s.read_wait(uint64_t(rounds % 4) * 16 * NvmeStore::kAlign, b.p, 16 * NvmeStore::kAlign);
      if (std::memcmp(a.p, b.p, 16 * NvmeStore::kAlign) != 0) break;
      std::memset(b.p, 0, 16 * NvmeStore::kAlign);
    }
    done = true;
  });
  int changes = 0;
  while (!done) {
    const RegisteredBuffer ra(&s, a.p, 16 * NvmeStore::kAlign), rc(&s, c.p, 8 * NvmeStore::kAlign);
    EXPECT_TRUE(ra.registered() && rc.registered());
    ++changes;
  }
  io.join();
  EXPECT_EQ(rounds, 30) << "a transfer came back wrong";
  EXPECT_GT(changes, 1);
  EXPECT_GT(s.fixed_pieces(), 0u);
}

// ---- GPUDirect Storage (cuFile), through the test stand-in for libcufile (tests/fake_cufile/);
// tests/gpu/test_gds.cpp runs the real library on a GPU.

// The start-up choice says which path and why, in each case.
TEST(Gds, TheChoiceSaysWhichPathAndWhy) {
  test::TempDir dir;
  const std::string d = dir.path.string();
  CheckpointIo c = choose_checkpoint_io(true, d, "0");
  EXPECT_FALSE(c.cufile);
  EXPECT_NE(c.text.find("pinned bounce: SF_CUFILE=0"), std::string::npos) << c.text;
  c = choose_checkpoint_io(false, d, "");
  EXPECT_FALSE(c.cufile);
  EXPECT_NE(c.text.find("cpu backend"), std::string::npos) << c.text;
  c = choose_checkpoint_io(true, d, (dir.path / "libcufile.so.0").string());
  EXPECT_FALSE(c.cufile);
  EXPECT_NE(c.text.find("pinned bounce: libcufile not found"), std::string::npos) << c.text;
  c = choose_checkpoint_io(true, d, "auto");  // this machine: libcufile absent, or present and chosen
  EXPECT_TRUE(c.cufile ? c.text.rfind("cuFile (libcufile.so", 0) == 0
                       : c.text.find("pinned bounce: ") != std::string::npos)
      << c.text;
  c = choose_checkpoint_io(false, d, SF_FAKE_CUFILE);  // a path: loaded whatever the backend
  EXPECT_TRUE(c.cufile) << c.text;
  EXPECT_EQ(c.library, SF_FAKE_CUFILE);
  EXPECT_EQ(c.text.rfind("cuFile (" + std::string(SF_FAKE_CUFILE) + " loaded, ", 0), 0u) << c.text;
  ::setenv("FAKE_CUFILE_REFUSE_HANDLE", "1", 1);
  c = choose_checkpoint_io(true, d, SF_FAKE_CUFILE);
  ::unsetenv("FAKE_CUFILE_REFUSE_HANDLE");
  EXPECT_FALSE(c.cufile);
  EXPECT_NE(c.text.find("cuFileHandleRegister failed: cuFile error 5018"), std::string::npos) << c.text;
  EXPECT_NE(c.text.find(d), std::string::npos) << c.text;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path)) << "the probe leaves nothing";
  // A library that lacks the calls: named.
  c = choose_checkpoint_io(true, d, "libc.so.6");
  EXPECT_FALSE(c.cufile);
  EXPECT_NE(c.text.find("lacks cuFileDriverOpen"), std::string::npos) << c.text;
}

// Transfers through cuFile land in the same file as the store's own (read back either way), odd
// sizes included, with short transfers and delays; a failure names the directory and the errno,
// and check() reports it after.
TEST(Gds, StoreTransfersThroughCuFile) {
  test::TempDir dir;
  StoreOptions o = small_store(dir, 8);
  o.direct = false;
  o.cufile = SF_FAKE_CUFILE;
  o.faults = disorder();
  NvmeStore s(o);
  ASSERT_TRUE(s.gpu_direct());
  EXPECT_NE(s.gpu_how().find("cuFile ("), std::string::npos) << s.gpu_how();
  std::mt19937 rng(11);
  std::vector<char> a(5 * NvmeStore::kAlign + 123), b(a.size()), c(a.size());
  for (char& x : a) x = char(rng());
  EXPECT_TRUE(s.gpu_register(b.data(), b.size()));
  s.gpu_write_wait(3 * NvmeStore::kAlign, a.data(), a.size());
  s.read_sync(3 * NvmeStore::kAlign, c.data(), c.size());  // the store's own path sees cuFile's bytes
  EXPECT_EQ(c, a);
  s.gpu_read_wait(3 * NvmeStore::kAlign, b.data(), b.size());
  EXPECT_EQ(b, a);
  s.gpu_unregister(b.data());
  EXPECT_EQ(s.gpu_bytes(), 2 * a.size());
  EXPECT_GE(s.bytes_written(), a.size());
  s.check();
  for (const bool reads : {false, true}) {
    StoreOptions f = o;
    f.faults = {};
    f.faults.fail_errno = reads ? EIO : ENOSPC;
    f.faults.fail_reads = reads;
    NvmeStore t(f);
    std::string what;
    try {
      t.gpu_write_wait(0, a.data(), a.size());
      t.gpu_read_wait(0, b.data(), b.size());
    } catch (const std::runtime_error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(o.dir), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(f.faults.fail_errno)), std::string::npos) << what;
    EXPECT_NE(what.find(reads ? "reading" : "writing"), std::string::npos) << what;
    EXPECT_THROW(t.check(), std::runtime_error);
  }
  // Chosen at start-up, but the file is refused at the store: a loud error, not a silent fallback.
  ::setenv("FAKE_CUFILE_REFUSE_HANDLE", "1", 1);
  std::string what;
  try {
    NvmeStore t(o);
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  ::unsetenv("FAKE_CUFILE_REFUSE_HANDLE");
  EXPECT_NE(what.find("GPUDirect Storage was chosen at start-up"), std::string::npos) << what;
  EXPECT_NE(what.find("SF_CUFILE=0"), std::string::npos) << what;
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

// ---- the working copies' ring (level 5)

// Uploads of working copies in the store, a piece at a time through a ring of fewer pieces than a
// blob has, give the slot the bytes the last update wrote, whatever the order in which the streams
// and the store complete: each round an update (a host function on its own stream, after the
// previous round's uploads were consumed) writes new working copies, and each blob is uploaded
// after its update. Random delays on every stream, one stream at a time stalled (h2d: a missing
// wait for the copy that frees a buffer lets the next read overwrite it; the update's: a read not
// waiting for the update reads the old copy; the reads' own), delayed and short transfers in the
// store, ring of 2 and 3 pieces, last pieces shorter than the others, a blob smaller than a piece.
// `fail_after`: reads fail with EIO past this many bytes (0: never); the store's error text, or "".
std::string upload_rounds(const std::vector<int64_t>& numel, int ring, uint64_t stall, uint64_t fail_after) {
  const int64_t P = StateStream::kPieceAlign;
  const int blobs = int(numel.size());
  {
    {
      CpuDeviceOptions co;
      co.max_delay_us = 30;
      co.stall_us = 2000;
      co.stall_every = 3;
      co.stall_streams = stall;  // created in order: h2d, compute, update, the ring's reads
      co.delay_seed = uint64_t(ring) * 7 + stall;
      auto dev = make_cpu_device(co);
      auto h2d = dev->create_stream(), compute = dev->create_stream(), upd = dev->create_stream();
      StateStream::Config sc;
      sc.numel = numel;
      for (int b = 0; b < blobs; ++b) sc.order.push_back(b);
      sc.piece = P;
      sc.master.assign(size_t(blobs), true);
      sc.work.assign(size_t(blobs), true);
      sc.work_bytes = 2;
      WeightStream::Config wc;
      wc.numel = numel;
      wc.elem_bytes = 2;
      wc.piece = P;
      wc.ring = ring;
      test::TempDir dir;
      StoreOptions so;
      so.dir = dir.path.string();
      so.bytes = StateStream::store_bytes(sc);
      so.depth = 3;
      so.piece = 4096;  // a ring piece in several requests
      so.faults.max_delay_us = 200;
      so.faults.short_transfers = true;
      if (fail_after > 0) {
        so.faults.fail_errno = EIO;
        so.faults.fail_reads = true;
        so.faults.fail_after_bytes = fail_after;
      }
      NvmeStore store(so);
      MemoryItems items = StateStream::buffers(sc);
      for (const MemoryItem& m : WeightStream::buffers(wc)) items.push_back(m);
      BufferSource src(*dev, items);
      StateStream state(store, sc, src);
      WeightStream w(*dev, store, state, wc, src);
      EXPECT_EQ(w.ring(), ring);
      EXPECT_LT(w.pinned_bytes(), size_t(*std::max_element(numel.begin(), numel.end())) * 2);  // less than the largest copy
      std::vector<bool> layer(size_t(blobs), true);
      SlotCache slots(*dev, {SlotCache::capacities(3, numel, layer), DType::BF16, P}, *h2d, *compute);
      const int rounds = 3;
      // The working copy of blob b written in round r: 16-bit words that name both.
      auto word = [](int r, int b, int64_t i) { return uint16_t((r * 7919 + b * 104729 + i * 31) & 0xffff); };
      std::vector<std::vector<uint16_t>> seen(size_t(rounds * blobs));
      std::vector<std::unique_ptr<Event>> updated;
      for (int b = 0; b < blobs; ++b) updated.push_back(dev->create_event());
      auto consumed = dev->create_event();
      for (int r = 0; r < rounds; ++r) {
        dev->wait(*upd, *consumed);  // the last round's slots are read (so are its working copies)
        for (int b = 0; b < blobs; ++b) {
          StateStream* st = &state;
          const int64_t n = numel[size_t(b)];
          dev->host_fn(*upd, [st, r, b, n, &word] {
            std::vector<uint16_t> v(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) v[size_t(i)] = word(r, b, i);
            st->write(StateStream::Work, b, 0, n, v.data());
          });
          dev->record(*updated[size_t(b)], *upd);
          WeightStream* ws = &w;
          Event* u = updated[size_t(b)].get();
          const UploadSource from{nullptr, DType::BF16, w.piece(),
                                  [ws, b, u](Stream& s, int64_t first, int64_t k) { return ws->begin(b, first, k, *u, s); },
                                  [ws](Stream& s) { ws->end(s); }};
          const int k = slots.acquire(b, from, n, *updated[size_t(b)], true);
          std::vector<uint16_t>* out = &seen[size_t(r * blobs + b)];
          const void* slot = slots.data(k);
          dev->host_fn(*compute, [out, slot, n] {
            const uint16_t* p = static_cast<const uint16_t*>(slot);
            out->assign(p, p + n);
          });
          slots.release(k);
        }
        slots.invalidate();  // the next round's update changes every blob
        dev->record(*consumed, *compute);
      }
      dev->synchronize(*compute);
      if (fail_after > 0) {
        try {
          store.check();
        } catch (const std::runtime_error& e) {
          return e.what();
        }
        return "";
      }
      state.check();
      for (int r = 0; r < rounds; ++r)
        for (int b = 0; b < blobs; ++b) {
          const std::vector<uint16_t>& got = seen[size_t(r * blobs + b)];
          EXPECT_EQ(got.size(), size_t(numel[size_t(b)]));
          if (got.size() != size_t(numel[size_t(b)])) continue;
          int64_t wrong = 0;
          for (int64_t i = 0; i < numel[size_t(b)]; ++i) wrong += got[size_t(i)] != word(r, b, i);
          EXPECT_EQ(wrong, 0) << "round " << r << ", blob " << b;
        }
      EXPECT_EQ(slots.uploads(), rounds * blobs);
      uint64_t copy_bytes = 0;
      for (int64_t n : numel) copy_bytes += uint64_t(n) * 2;
      EXPECT_EQ(slots.uploaded_bytes(), copy_bytes * rounds);
      EXPECT_GE(store.bytes_read(), copy_bytes * rounds);
    }
  }
  return "";
}

TEST(WeightStream, UploadsInPiecesGiveTheBytesOfTheLastUpdate) {
  const int64_t P = StateStream::kPieceAlign;
  for (const int ring : {2, 3})
    for (const uint64_t stall : {uint64_t(1), uint64_t(4), uint64_t(8), ~uint64_t(0)}) {
      SCOPED_TRACE("ring " + std::to_string(ring) + ", stalled streams " + std::to_string(stall));
      EXPECT_EQ(upload_rounds({5 * P + 100, 2 * P, 700, 3 * P}, ring, stall, 0), "");
    }
}

// A read of a piece that fails (EIO in the middle of the second blob's pieces) is the store's
// error at the next check, with the directory and the errno; the streams run on (no hang waiting
// for the failed piece, no exception out of the ring's destructor). (Blobs of whole blocks: the
// updates' writes read nothing, so the reads counted are the ring's.)
TEST(WeightStream, AFailedReadIsTheStoresError) {
  const int64_t P = StateStream::kPieceAlign;
  const std::vector<int64_t> numel = {3 * P, 4 * P, 2 * P};
  for (const uint64_t stall : {uint64_t(1), uint64_t(8)}) {
    const std::string what = upload_rounds(numel, 2, stall, uint64_t(numel[0] + 2 * P) * 2 + 1);
    EXPECT_NE(what.find("offload dir"), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(EIO)), std::string::npos) << what;
  }
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
// synchronisation of a save) with the directory and the errno, never silently: the state ring's
// pieces on registered buffers (READ_FIXED / WRITE_FIXED) and, the kernel refusing to register
// them, on plain requests.
TEST(NvmeTier, AFailedTransferStopsTheRun) {
  ModelSpec spec = parse_model_spec(test::tiny_config("llama"), "tiny");
  for (const int level : {2, 5})
  for (const bool reads : {false, true})
    for (const bool clip : {false, true})
      for (const bool refuse : {false, true}) {
      const int err = reads ? EIO : ENOSPC;
      SCOPED_TRACE(std::string(reads ? "reads" : "writes") + (clip ? ", clipping" : "") +
                   (refuse ? ", registration refused" : "") + ", level " + std::to_string(level));
      test::TempDir dir;
      auto dev = make_cpu_device();
      SlidingOptions so;
      so.base.max_batch = 2;
      so.base.max_seq = 9;
      so.keep_grads = clip;
      for (int b = 1; b <= spec.n_layer; ++b) so.disk_blobs.push_back(b);
      so.disk_piece = StateStream::kPieceAlign;  // several pieces a blob
      // Level 5: the masters and the working copies there too; the first read of a run is then a
      // piece of a working copy, read by the weight ring for the first upload.
      if (level >= 5) so.disk_masters = so.disk_weights = so.disk_blobs;
      so.store.dir = dir.path.string();
      so.store.faults.fail_errno = err;
      so.store.faults.fail_reads = reads;
      so.store.faults.fail_after_bytes = 1;
      so.store.faults.refuse_registration = refuse;
      std::vector<Record> recs;
      const std::vector<Batch> mbs = some_batches(spec, recs);
      SlidingEngine e(*dev, spec, so);
      const std::string how = e.stats().disk_io;
      if (how.rfind("io_uring", 0) == 0) {
        EXPECT_NE(how.find(refuse ? "buffers not registered" : level >= 5 ? "2 registered buffers" : "1 registered buffer"),
                  std::string::npos)
            << how;
      }
      Engine::StepParams p;
      p.adamw.lr = 1e-3f;
      p.max_grad_norm = clip ? 1.0 : 0.0;
      std::string what;
      try {
        e.init_random(1);  // (level 5: writes the masters and working copies to the store)
        for (int s = 1; s <= 3; ++s) {
          p.adamw.step = s;
          e.step({mbs[0]}, p);
        }
        e.synchronize();
      } catch (const std::runtime_error& err) {
        what = err.what();
      }
      EXPECT_NE(what.find(dir.path.string()), std::string::npos) << what;
      EXPECT_NE(what.find(std::strerror(err)), std::string::npos) << what;
    }
}

// The planner's PCIe figure is what the engine's uploads copy: 4 bytes a parameter from an fp32
// master, the compute dtype's 2 from the working copy of a master in the store (level 4, in host
// memory; level 5, read from the store first). Only layers slide (the embedding and the head stay
// on the GPU), so every upload is of one layer's size and the bytes of one pass divide evenly.
TEST(NvmeTier, PlannedUploadBytesAreWhatTheEngineCopies) {
  ModelSpec spec = parse_model_spec(test::tiny_config("llama"), "tiny");
  const ModelLayout layout = make_layout(spec);
  for (int level : {0, 4, 5}) {
    SCOPED_TRACE("level " + std::to_string(level));
    test::TempDir dir;
    auto dev = make_cpu_device();
    SlidingOptions so;
    so.base.max_batch = 2;
    so.base.max_seq = 9;
    so.base.compute_dtype = "bf16";  // a working copy is half a master
    so.gpu_blobs = {0, spec.n_layer + 1};
    for (int b = 1; b <= spec.n_layer && level > 0; ++b) so.disk_blobs.push_back(b);
    if (level >= 4) so.disk_masters = so.disk_blobs;
    if (level >= 5) so.disk_weights = so.disk_blobs;
    so.store.dir = dir.path.string();
    Plan p;
    p.engine = EngineKind::Sliding;
    p.gpu_blobs = so.gpu_blobs;
    p.disk_blobs = so.disk_blobs;
    p.disk_masters = so.disk_masters;
    p.disk_weights = so.disk_weights;
    const uint64_t planned = upload_bytes_per_pass(spec, p, DType::BF16);
    const int64_t layer_numel = layout.blobs[1].numel;
    EXPECT_EQ(planned, uint64_t(spec.n_layer) * uint64_t(layer_numel) * (level >= 4 ? 2 : 4));
    std::vector<Record> recs;
    const std::vector<Batch> mbs = some_batches(spec, recs);
    SlidingEngine e(*dev, spec, so);
    e.init_random(2);
    Engine::StepParams sp;
    sp.adamw.lr = 1e-3f;
    sp.max_grad_norm = 1.0;
    for (int s = 1; s <= 2; ++s) {
      sp.adamw.step = s;
      e.step({mbs[size_t(s % 2)]}, sp);
    }
    e.synchronize();
    const Engine::Stats st = e.stats();
    ASSERT_GT(st.uploads, 0);
    EXPECT_EQ(st.uploaded_bytes * uint64_t(spec.n_layer), planned * uint64_t(st.uploads));
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
  so.disk_piece = StateStream::kPieceAlign;       // the layers' state and working copies in several pieces
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
