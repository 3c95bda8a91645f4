// The AdamW state ring's read-ahead into lent checkpoint memory (engine/state_stream.h, docs/ENGINE.md
// "Read-ahead into freed checkpoints"), alone, in the engine's protocol: each round a "backward"
// stream lends layer regions of one buffer from the last down, an "update" stream runs every
// blob's update piece by piece in forward order (m += 1, v += 2), and a "forward" stream takes
// each region back once the update of its layer's blobs is queued before it, then overwrites it
// (the checkpoint's offload). Random delays on every stream, one stalled at a time, delayed and
// short transfers in the store, rounds whose updates are skipped (a non-finite norm): the state in
// the store must count every update exactly, and pieces must really have been read into lent
// memory. (The whole engine: tests/test_sliding_engine.cpp, the `_lend` cases.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "engine/state_stream.h"
#include "io/nvme_store.h"
#include "test_util.h"

namespace sf {
namespace {

struct LendCase {
  uint64_t stall;         // the stalled stream: 1 backward (lends), 2 updates, 4 forward (reclaims)
  std::vector<int> skip;  // rounds without updates
  const char* name;
  // As the engine's checkpoint store: once the lends have run, each region is first offered to
  // try_reclaim when the forward is queued, and taken back in stream order only where it refuses.
  bool early = false;
};

class StateLending : public ::testing::TestWithParam<LendCase> {};

TEST_P(StateLending, EveryUpdateCountsOnceWhateverTheOrder) {
  const LendCase c = GetParam();
  const int64_t P = StateStream::kPieceAlign;
  // Blobs of several pieces (the last shorter), one smaller than a piece.
  const std::vector<int64_t> numel = {3 * P + 100, 2 * P, P / 2, 4 * P - 7, 2 * P + 1};
  const int blobs = int(numel.size()), layers = blobs;
  StateStream::Config sc;
  sc.numel = numel;
  for (int b = 0; b < blobs; ++b) sc.order.push_back(b);  // forward order (clipping)
  sc.piece = P;
  sc.ring = 2;
  test::TempDir dir;
  StoreOptions so;
  so.dir = dir.path.string();
  so.bytes = StateStream::store_bytes(sc);
  so.depth = 3;
  so.piece = 4096;
  so.faults.max_delay_us = 300;
  so.faults.short_transfers = true;
  NvmeStore store(so);
  CpuDeviceOptions co;
  co.max_delay_us = 40;
  co.stall_us = 3000;
  co.stall_every = 3;
  co.stall_streams = c.stall;  // created in order: backward, updates, forward
  co.delay_seed = c.stall * 13 + c.skip.size();
  auto dev = make_cpu_device(co);
  auto bwd = dev->create_stream(), upd = dev->create_stream(), fwd = dev->create_stream();
  BufferSource src(*dev, StateStream::buffers(sc));
  StateStream state(store, sc, src);
  // The "checkpoints": one region a layer, each room for a piece and a half, not block-aligned.
  const size_t piece_bytes = size_t(P) * 4 * 2;  // m and v of a piece
  const size_t stride = piece_bytes * 3 / 2 + 200;
  std::vector<char> ckpt(stride * size_t(layers) + NvmeStore::kAlign);
  char* base = ckpt.data() + 100;
  std::vector<std::unique_ptr<Event>> updated, lent;
  for (int b = 0; b < blobs; ++b) updated.push_back(dev->create_event());
  auto lent_all = dev->create_event();
  const int rounds = 5;
  int done = 0;  // rounds with updates
  int early_taken = 0;  // regions try_reclaim took back at once
  for (int r = 0; r < rounds; ++r) {
    const bool skip = std::find(c.skip.begin(), c.skip.end(), r) != c.skip.end();
    // The backward: the layers' regions lent from the last one down; layer l's region may hold
    // pieces of blobs 0..l (their updates come before the forward writes it again).
    for (int l = layers - 1; l >= 0; --l) {
      char* mem = base + size_t(l) * stride;
      StateStream* st = &state;
      dev->host_fn(*bwd, [st, l, mem, stride] { st->lend(l, mem, stride, l); });
    }
    dev->record(*lent_all, *bwd);
    // The updates, after the backward (the norm), in forward order.
    dev->wait(*upd, *lent_all);
    for (int b = 0; b < blobs && !skip; ++b) {
      StateStream* st = &state;
      const int64_t n = numel[size_t(b)];
      dev->host_fn(*upd, [st, b, n] {
        for (int64_t e = 0; e < n;) {
          const StateStream::View v = st->acquire(b);
          float* m = static_cast<float*>(v.m);
          float* w = static_cast<float*>(v.v);
          for (int64_t i = 0; i < v.n; ++i) {
            m[i] += 1.f;
            w[i] += 2.f;
          }
          e += v.n;
          st->release(b);
        }
      });
      dev->record(*updated[size_t(b)], *upd);
    }
    // The forward: layer l after the update of blob l; its region taken back and overwritten.
    if (c.early) dev->synchronize(*bwd);  // every lend has run
    dev->wait(*fwd, *lent_all);
    for (int l = 0; l < layers; ++l) {
      if (!skip) dev->wait(*fwd, *updated[size_t(l)]);
      char* mem = base + size_t(l) * stride;
      StateStream* st = &state;
      const bool now = c.early && state.try_reclaim(l);
      early_taken += now;
      dev->host_fn(*fwd, [st, l, mem, stride, now] {
        if (!now) st->reclaim(l);
        std::memset(mem, 0x7f, stride);  // the offload: garbage for the state
      });
    }
    done += !skip;
    dev->synchronize(*fwd);
    dev->synchronize(*upd);
    dev->synchronize(*bwd);
  }
  state.quiesce();
  EXPECT_GT(state.lent_reads(), 0u) << "no piece was read into lent memory";
  if (c.early) EXPECT_GT(early_taken, 0) << "try_reclaim never took a region back";
  for (int b = 0; b < blobs; ++b) {
    std::vector<float> m(size_t(numel[size_t(b)])), v(m.size());
    state.read(StateStream::M, b, 0, numel[size_t(b)], m.data());
    state.read(StateStream::V, b, 0, numel[size_t(b)], v.data());
    for (size_t i = 0; i < m.size(); ++i) {
      ASSERT_EQ(m[i], float(done)) << "blob " << b << " element " << i;
      ASSERT_EQ(v[i], float(2 * done)) << "blob " << b << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StateStream, StateLending,
                         ::testing::Values(LendCase{0, {}, "no_stall"}, LendCase{1, {}, "stalled_lends"},
                                           LendCase{2, {}, "stalled_updates"}, LendCase{4, {}, "stalled_reclaims"},
                                           LendCase{0, {1, 2}, "skipped_rounds"},
                                           LendCase{2, {2}, "skipped_round_stalled_updates"},
                                           LendCase{4, {0, 3}, "skipped_rounds_stalled_reclaims"},
                                           LendCase{0, {}, "early", true}, LendCase{2, {}, "early_stalled_updates", true},
                                           LendCase{4, {}, "early_stalled_reclaims", true},
                                           LendCase{2, {1, 3}, "early_skipped_rounds_stalled_updates", true}),
                         [](const ::testing::TestParamInfo<LendCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace sf
