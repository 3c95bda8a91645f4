// Packing (--pack, data/pack.h): the packer itself, RoPE with per-token positions, and a packed
// row of several records giving the loss and gradients of those records run one a row, for a
// tiny model of every family on the cpu backend.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/kernels.h"
#include "cli/option_names.h"
#include "data/dataset/dataset.h"
#include "data/dataset/pack.h"
#include "engine/resident_engine.h"
#include "engine/sliding_engine.h"
#include "engine_state.h"
#include "model/rope.h"
#include "model/spec.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace sf {
namespace {

Record rec(int len, int32_t first = 1) {
  Record r;
  for (int t = 0; t < len; ++t) r.ids.push_back(first + t);
  r.labels = r.ids;
  return r;
}

std::vector<const Record*> ptrs(const std::vector<Record>& v) {
  std::vector<const Record*> p;
  for (const Record& r : v) p.push_back(&r);
  return p;
}

// ---------------------------------------------------------------- the packer

TEST(Pack, BestFitDecreasingWithCutsAndEmptyRecords) {
  // seq_len 8, one window. Longest first: 12 (cut to 8) fills a row alone; 6 opens a row (room
  // 2); 5 does not fit there: a new row (room 3); 4 a new row (room 4); 3 goes where the room is
  // least that holds it (the 5's row, room 3 -> 0); 2 into the 6's row (2 -> 0); 1 into the 4's row.
  // The empty record is skipped. Rows come out by their earliest record, records in order inside.
  std::vector<Record> v = {rec(3), rec(4), rec(1), rec(12), rec(0), rec(5), rec(2), rec(6)};
  auto rows = pack_records(ptrs(v), 8);
  const std::vector<std::vector<size_t>> want = {{0, 5}, {1, 2}, {3}, {6, 7}};
  EXPECT_EQ(rows, want);
  EXPECT_EQ(pack_records(ptrs(v), 8), rows);  // deterministic
  // Exact fits close rows: 4+4, 8, 7+1.
  std::vector<Record> full = {rec(4), rec(7), rec(8), rec(4), rec(1)};
  const std::vector<std::vector<size_t>> want_full = {{0, 3}, {1, 4}, {2}};
  EXPECT_EQ(pack_records(ptrs(full), 8), want_full);
  EXPECT_TRUE(pack_records({}, 8).empty());
}

// A real-length SFT mix (50-800 tokens, seq_len 2048): every record once, no row over seq_len,
// and the slots filled far better than by in-order greedy packing (here 98.6 % against 86.7 %).
TEST(Pack, WindowsPackEveryRecordOnceAndFillTheRows) {
  std::mt19937_64 rng(11);
  std::vector<Record> v;
  for (int i = 0; i < 3000; ++i) v.push_back(rec(50 + int(rng() % 751)));
  v[17] = rec(0);
  v[40] = rec(5000);  // cut to 2048: a row alone
  const int seq = 2048;
  const auto rows = pack_records(ptrs(v), seq);
  std::vector<int> seen(v.size(), 0);
  int64_t tokens = 0;
  for (const auto& row : rows) {
    int n = 0;
    for (size_t k : row) {
      ++seen[k];
      n += packed_length(v[k], seq);
    }
    EXPECT_LE(n, seq);
    EXPECT_TRUE(std::is_sorted(row.begin(), row.end()));
    tokens += n;
  }
  for (size_t k = 0; k < v.size(); ++k) EXPECT_EQ(seen[k], k == 17 ? 0 : 1) << k;
  const double fill = double(tokens) / double(int64_t(rows.size()) * seq);
  // In-order greedy (the packer before windows) on the same records, for the comparison.
  int64_t greedy_rows = 0;
  int used = seq;
  for (const Record& r : v) {
    const int n = packed_length(r, seq);
    if (n == 0) continue;
    if (used + n > seq) {
      ++greedy_rows;
      used = 0;
    }
    used += n;
  }
  const double greedy_fill = double(tokens) / double(greedy_rows * seq);
  EXPECT_GT(fill, 0.98) << "greedy " << greedy_fill;
  EXPECT_LT(greedy_fill, 0.9);
  // Rows follow their earliest record: the windows keep the data order coarsely.
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1].front(), rows[i].front());
}

TEST(Pack, RowPackerStreamsThePackRowsAndResumes) {
  Dataset ds;
  for (int len : {3, 4, 1, 12, 0, 5, 2, 6}) ds.records.push_back(rec(len));
  RecordOrder order(ds.records.size(), false, 0);
  RowPacker p(ds, order, 8);
  // File order: the rows of pack_records (one window: the whole epoch), then the next epoch.
  std::vector<std::vector<const Record*>> got;
  for (int i = 0; i < 4; ++i) got.push_back(p.next_row());
  const auto rows = pack_records(ptrs(ds.records), 8);
  ASSERT_EQ(got.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(got[i].size(), rows[i].size());
    for (size_t j = 0; j < rows[i].size(); ++j) EXPECT_EQ(got[i][j], &ds.records[rows[i][j]]);
  }
  EXPECT_EQ(p.window_start(), 0u);
  EXPECT_EQ(p.rows_taken(), 4u);
  EXPECT_EQ(p.next_row().front(), &ds.records[0]);
  EXPECT_EQ(p.window_start(), 8u);  // the second epoch's window
  EXPECT_EQ(p.rows_taken(), 1u);
  // Every record empty: refused (it would never fill a row).
  Dataset empty;
  empty.records.resize(3);
  RecordOrder oe(3, false, 0);
  test::expect_check_failure([&] { RowPacker(empty, oe, 8); }, "pack.cpp", "every record is empty");
}

// Shuffled, many windows: a packer resumed where another stands gives the same rows, and the
// first epoch uses every non-empty record exactly once.
TEST(Pack, RowPackerResumesAcrossWindowsAndEpochs) {
  std::mt19937_64 rng(5);
  Dataset ds;
  for (int i = 0; i < 700; ++i) ds.records.push_back(rec(int(rng() % 40)));  // some empty
  const int seq = 64;
  RecordOrder o1(ds.records.size(), true, 7);
  RowPacker a(ds, o1, seq);
  std::vector<int> seen(ds.records.size(), 0);
  std::vector<std::vector<const Record*>> ahead;  // the rows resumed packers gave at the last resume
  size_t at = 0;                                  // of them, those the going packer has matched
  for (int i = 0; i < 500; ++i) {
    if (i % 37 == 0) {  // resume here, twice: the next rows agree (across window ends too)
      RecordOrder o2(ds.records.size(), true, 7), o3(ds.records.size(), true, 7);
      RowPacker b(ds, o2, seq, a.window_start(), a.rows_taken()), c(ds, o3, seq, a.window_start(), a.rows_taken());
      ahead.clear();
      at = 0;
      for (int k = 0; k < 60; ++k) ahead.push_back(b.next_row());
      for (int k = 0; k < 60; ++k) ASSERT_EQ(c.next_row(), ahead[size_t(k)]) << i << " " << k;
    }
    const uint64_t before = a.window_start();
    const std::vector<const Record*> row = a.next_row();
    if (at < ahead.size()) {  // the packer that went on: the same rows
      ASSERT_EQ(row, ahead[at]) << i;
      ++at;
    }
    if (before < ds.records.size() && a.window_start() == ds.records.size()) {
      // The first epoch ended before this row: every non-empty record was in it once.
      for (size_t k = 0; k < ds.records.size(); ++k) ASSERT_EQ(seen[k], ds.records[k].ids.empty() ? 0 : 1) << k;
      break;
    }
    ASSERT_LT(i, 499) << "no epoch end in 500 rows";
    for (const Record* r : row) ++seen[size_t(r - ds.records.data())];
  }
  // A position past the window's rows (a checkpoint of other data or --seq-len) is an input error.
  RecordOrder o4(ds.records.size(), true, 7);
  const InputError e = test::expect_setting_error([&] { RowPacker(ds, o4, seq, 0, 100000); }, Setting::Resume);
  EXPECT_NE(std::string(e.what()).find("packing position"), std::string::npos) << e.what();
  EXPECT_NE(e.message(option_name).find("--resume: the checkpoint's packing position"), std::string::npos);
  EXPECT_NE(e.message(option_name).find("does not fit this data and --seq-len"), std::string::npos);
}

TEST(Pack, PackedBatchLayout) {
  std::vector<Record> v = {rec(3, 10), rec(2, 20), rec(4, 30)};
  v[2].labels[2] = kIgnoreIndex;
  Batch b = make_packed_batch({{&v[0], &v[1]}, {&v[2]}}, 6);
  ASSERT_EQ(b.B, 2);
  ASSERT_EQ(b.T, 5);  // the longest row
  const int32_t X = kIgnoreIndex;
  EXPECT_EQ(b.ids, (std::vector<int32_t>{10, 11, 12, 20, 21, /**/ 30, 31, 32, 33, 0}));
  // Inside a record targets[t] = labels[t+1]; a record's last token predicts nothing (never the
  // next record's first token); padding is not trained.
  EXPECT_EQ(b.targets, (std::vector<int32_t>{11, 12, X, 21, X, /**/ 31, X, 33, X, X}));
  EXPECT_EQ(b.pos, (std::vector<int32_t>{0, 1, 2, 0, 1, /**/ 0, 1, 2, 3, 0}));
  EXPECT_EQ(b.trained, trained_targets(v[0], 6) + trained_targets(v[1], 6) + trained_targets(v[2], 6));
  EXPECT_EQ(b.trained, 5);
  // A record longer than seq_len is cut as make_batch cuts it.
  Record longr = rec(9, 40);
  Batch c = make_packed_batch({{&longr}}, 6), u = make_batch({&longr}, 6);
  EXPECT_EQ(c.ids, u.ids);
  EXPECT_EQ(c.targets, u.targets);
  EXPECT_EQ(c.trained, u.trained);
  EXPECT_EQ(c.pos, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(u.pos.empty());
}

TEST(Pack, WholeFileBatches) {
  std::vector<Record> v = {rec(3), rec(4), rec(1), rec(12), rec(0), rec(5), rec(2), rec(6)};
  const auto p = ptrs(v);
  const auto batches = make_packed_batches(p, 8, 3);  // rows {0,5} {1,2} {3} {6,7}: batches of 3 + 1
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[0].B, 3);
  EXPECT_EQ(batches[1].B, 1);
  Batch first = make_packed_batch({{p[0], p[5]}, {p[1], p[2]}, {p[3]}}, 8);
  EXPECT_EQ(batches[0].ids, first.ids);
  EXPECT_EQ(batches[0].targets, first.targets);
  EXPECT_EQ(batches[0].pos, first.pos);
  int64_t trained = 0;
  for (const Batch& b : batches) trained += b.trained;
  int64_t want = 0;
  for (const Record& r : v) want += trained_targets(r, 8);
  EXPECT_EQ(trained, want);  // every record's targets, once
}

// ---------------------------------------------------------------- RoPE with positions

// RoPE over a packed row = RoPE of each record alone (positions restart at 0), bit for bit, both
// directions; out-of-range positions are refused.
TEST(Pack, RopeWithPositionsEqualsRecordsAlone) {
  const std::vector<int> lens = {5, 1, 7, 3};
  const int T = 16, nh = 3, hd = 8, w = nh * hd;
  std::vector<int32_t> pos;
  for (int n : lens)
    for (int t = 0; t < n; ++t) pos.push_back(t);
  std::vector<float> cos, sin;
  ModelSpec s = parse_model_spec(test::tiny_config("llama"), "tiny");
  s.head_dim = hd;
  rope_tables(s, T, cos, sin);
  auto x = test::randn(size_t(T) * w, 1200);
  for (bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "backward" : "forward");
    auto y = x;
    (inverse ? cpu::rope_backward : cpu::rope_forward)(test::view_of(y, {T, w}), test::view_of(cos, {T, hd / 2}),
                                                       test::view_of(sin, {T, hd / 2}), T, nh, hd,
                                                       test::view_of(pos, {T}));
    int at = 0;
    for (int n : lens) {
      std::vector<float> r(x.begin() + int64_t(at) * w, x.begin() + int64_t(at + n) * w);
      (inverse ? cpu::rope_backward : cpu::rope_forward)(test::view_of(r, {n, w}), test::view_of(cos, {T, hd / 2}),
                                                         test::view_of(sin, {T, hd / 2}), n, nh, hd, Tensor());
      EXPECT_EQ(r, std::vector<float>(y.begin() + int64_t(at) * w, y.begin() + int64_t(at + n) * w)) << at;
      at += n;
    }
  }
  auto bad = pos;
  bad[3] = 9;  // position 9 at row 3
  test::expect_check_failure(
      [&] {
        cpu::rope_forward(test::view_of(x, {T, w}), test::view_of(cos, {T, hd / 2}), test::view_of(sin, {T, hd / 2}), T,
                          nh, hd, test::view_of(bad, {T}));
      },
      "rope.cpp", "out of range");
}

// ---------------------------------------------------------------- packed = unpacked

std::vector<Record> model_records(int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Record> recs;
  for (int len : {11, 7, 4, 9, 1}) {
    Record r;
    for (int t = 0; t < len; ++t) r.ids.push_back(int32_t(rng() % vocab));
    r.labels = r.ids;
    recs.push_back(r);
  }
  recs[1].labels[2] = recs[1].labels[3] = kIgnoreIndex;  // a masked span
  recs[3].labels[0] = recs[3].labels[1] = kIgnoreIndex;
  return recs;
}

struct Result {
  double loss = 0;
  test::NamedTensors grads;
};

Result run(ResidentEngine& e, const Batch& b, int64_t trained) {
  e.zero_grads();
  e.forward_backward(b, float(1.0 / double(trained)), true);
  Result r;
  r.loss = e.take_loss_sum();
  r.grads = test::export_grads(e);
  return r;
}

class PackedModel : public ::testing::TestWithParam<std::string> {};

// Two packed rows {11}, {7, 4, 9, 1} (B 2 x T 21) against the five records one a row (B 5 x T 11),
// on the same weights, through the resident engine on the cpu backend (every family: GQA and MHA,
// biases, q/k-norm, llama3 RoPE scaling, tied and untied heads). The attention, RoPE, norms and
// the per-token loss of each record are computed bit for bit as when unpacked (the CPU attention
// sums the same keys in the same order; tested above); what differs is the order of the sums over
// tokens — the weight gradients (GEMMs over all N tokens, blocked differently for N = 21 x 2 and
// 11 x 5) and the loss sum — so the comparison is to 1e-6 relative (norm-wise per tensor), not bits.
TEST_P(PackedModel, PackedRowsGiveTheLossAndGradientsOfTheRecords) {
  auto dev = make_cpu_device();
  EngineOptions eo;
  eo.max_batch = 5;
  eo.max_seq = 24;
  eo.training = true;
  ResidentEngine e(*dev, parse_model_spec(test::tiny_config(GetParam()), "tiny"), eo);
  e.init_random(31);
  auto recs = model_records(int(e.spec().vocab), 32);
  const int seq = 24;
  Batch unpacked = make_batch({&recs[0], &recs[1], &recs[2], &recs[3], &recs[4]}, seq);
  Batch packed = make_packed_batch({{&recs[0]}, {&recs[1], &recs[2], &recs[3], &recs[4]}}, seq);
  ASSERT_EQ(packed.B, 2);
  ASSERT_EQ(packed.T, 21);
  ASSERT_EQ(packed.trained, unpacked.trained);
  const Result a = run(e, unpacked, unpacked.trained), b = run(e, packed, unpacked.trained);
  EXPECT_GT(a.loss, 0.0);
  EXPECT_LE(std::fabs(b.loss - a.loss), 1e-6 * a.loss) << b.loss << " vs " << a.loss;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_LE(test::rel_err(b.grads[i].data, a.grads[i].data), 1e-6) << a.grads[i].name;
  // The same rows given positions t (one record a row, through the packed code paths) give the
  // unpacked result bit for bit.
  Batch with_pos = make_packed_batch({{&recs[0]}, {&recs[1]}, {&recs[2]}, {&recs[3]}, {&recs[4]}}, seq);
  ASSERT_EQ(with_pos.ids, unpacked.ids);
  ASSERT_EQ(with_pos.targets, unpacked.targets);
  const Result c = run(e, with_pos, unpacked.trained);
  EXPECT_EQ(c.loss, a.loss);
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_EQ(c.grads[i].data, a.grads[i].data) << a.grads[i].name;
  // Without the block-diagonal mask and the restarted positions the packed loss differs: the
  // test would see a packing that leaked across records.
  Batch leaky = packed;
  leaky.pos.clear();
  const Result d = run(e, leaky, unpacked.trained);
  EXPECT_GT(std::fabs(d.loss - a.loss), 1e-4 * a.loss);
}

INSTANTIATE_TEST_SUITE_P(Families, PackedModel, ::testing::ValuesIn(test::families()));

// Both engines pass the positions through: three optimizer steps of two packed micro-batches each
// give the same losses and weights bit for bit in the sliding engine (2 slots, random delays and
// stalls on the token-upload stream) as in the resident engine.
TEST(PackedEngines, SlidingEqualsResidentOnPackedBatches) {
  ModelSpec spec = parse_model_spec(test::tiny_config("qwen3"), "tiny");
  auto recs = model_records(int(spec.vocab), 40);
  Dataset ds;
  for (const Record& r : recs) ds.records.push_back(r);
  EngineOptions eo;
  eo.max_batch = 2;
  eo.max_seq = 16;
  eo.max_micro = 2;
  auto train = [&](Engine& e) {
    RecordOrder order(ds.records.size(), true, 3);
    RowPacker packer(ds, order, 16);
    std::vector<double> losses;
    for (int s = 1; s <= 3; ++s) {
      std::vector<Batch> mbs;
      for (int j = 0; j < 2; ++j) mbs.push_back(make_packed_batch({packer.next_row(), packer.next_row()}, 16));
      Engine::StepParams p;
      p.adamw.lr = 1e-2f;
      p.adamw.step = s;
      p.max_grad_norm = 0.5;
      losses.push_back(e.step(mbs, p).loss);
    }
    return std::make_pair(losses, test::export_state(e, Engine::State::Params));
  };
  auto dev_r = make_cpu_device();
  ResidentEngine r(*dev_r, spec, eo);
  r.init_random(5);
  auto [lr, pr] = train(r);
  CpuDeviceOptions o;
  o.max_delay_us = 50;
  o.stall_us = 3000;
  o.stall_every = 4;
  o.stall_streams = 8;  // the token uploads
  auto dev_s = make_cpu_device(o);
  SlidingOptions so;
  so.base = eo;
  so.slots = 2;
  SlidingEngine sl(*dev_s, spec, so);
  sl.init_random(5);
  auto [ls, ps] = train(sl);
  EXPECT_EQ(lr, ls);
  ASSERT_EQ(pr.size(), ps.size());
  for (size_t i = 0; i < pr.size(); ++i) EXPECT_EQ(pr[i].data, ps[i].data) << pr[i].name;
}

}  // namespace
}  // namespace sf
