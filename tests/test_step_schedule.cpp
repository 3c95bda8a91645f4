// The sliding engine's schedule (engine/step_schedule.h) as data: for every mode — clipping x split
// update x held gradients x blobs kept on the GPU, with and without blobs whose moments are on
// disk, tied and untied, 1, 2 and 4 layers — the schedules the engine executes (SlidingEngine::schedule)
// are run through a checker over several consecutive passes, in the order they are queued: each
// wait has a producer earlier in the order and it is the right one, every gradient lands before its
// update, every blob is updated once a step, no update runs before the norm with clipping, uploads
// wait for the blob's last update, a gradient store is overwritten only after its last reader.
// Mutated schedules (a wait or a record removed, an update moved) must be refused by the checker.
// That each mode also trains like the resident engine byte for byte is tests/test_sliding_engine.cpp
// (the "Modes" cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "engine/sliding_engine.h"
#include "engine/step_schedule.h"
#include "model/spec.h"
#include "model_fixtures.h"

namespace sf {
namespace {

using Part = cpu::AdamWPart;

// One operation of a sequence of passes: which pass (0, 1, ...) and whether that pass updates.
struct SeqOp {
  const ScheduleOp* op;
  int pass;
};

// Expands passes into the order in which their operations are queued: a pass's deferred operations
// run at the next pass's FlushMoments (or at the end, a synchronisation).
std::vector<SeqOp> expand(const std::vector<const StepSchedule*>& passes) {
  std::vector<SeqOp> out;
  const StepSchedule* pending = nullptr;
  int pending_pass = -1;
  for (int i = 0; i < int(passes.size()); ++i) {
    for (const ScheduleOp& op : passes[size_t(i)]->ops) {
      out.push_back({&op, i});
      if (op.kind == OpKind::FlushMoments && pending) {
        for (const ScheduleOp& d : pending->deferred) out.push_back({&d, pending_pass});
        pending = nullptr;
      }
    }
    if (!passes[size_t(i)]->deferred.empty()) {
      pending = passes[size_t(i)];
      pending_pass = i;
    }
  }
  if (pending)
    for (const ScheduleOp& d : pending->deferred) out.push_back({&d, pending_pass});
  return out;
}

std::string where(const SeqOp& s) {
  return "pass " + std::to_string(s.pass) + " " + to_string(s.op->phase) + " " + to_string(s.op->kind) + " " +
         std::to_string(s.op->blob);
}

bool writes_master(const ScheduleOp& op) {  // the op writes the blob's master (uploads must wait)
  return (op.kind == OpKind::Update && op.part != Part::Moments) || (op.kind == OpKind::SendGrad && op.chunk_updates);
}
bool reads_store(const ScheduleOp& op) {  // a host update reading the blob's held gradient store
  return op.kind == OpKind::Update && op.stream == StreamId::Opt;
}
bool records(const ScheduleOp& op, EventId id, int blob) {
  return std::any_of(op.records.begin(), op.records.end(),
                     [&](const StreamEvent& r) { return r.ev == EventRef{id, blob}; });
}
const StreamEvent* record_of(const ScheduleOp& op, EventId id, int blob) {
  for (const StreamEvent& r : op.records)
    if (r.ev == EventRef{id, blob}) return &r;
  return nullptr;
}

// Every violation of the schedule's invariants over these passes, in words.
std::vector<std::string> check(const std::vector<const StepSchedule*>& passes) {
  std::vector<std::string> bad;
  auto fail = [&](const std::string& s) { bad.push_back(s); };
  const ScheduleConfig& c = passes[0]->config;
  const int nb = c.layers + 2, head = c.layers + 1;
  auto kept = [&](int b) { return c.roles[size_t(b)].kept; };
  const std::vector<SeqOp> seq = expand(passes);

  // Streams: each event recorded on the stream that owns it; updates where their blob lives.
  const StreamId owner[3] = {StreamId::D2H, StreamId::Opt, StreamId::Opt};
  for (const SeqOp& s : seq) {
    const ScheduleOp& op = *s.op;
    for (const StreamEvent& r : op.records)
      if (r.stream != owner[int(r.ev.id)]) fail(where(s) + ": records " + to_string(r.ev.id) + " on the wrong stream");
    if (op.kind == OpKind::Update && (op.stream == StreamId::Compute) != kept(op.blob))
      fail(where(s) + ": a kept blob updates on compute, a host blob on opt");
    if (op.kind == OpKind::Update && kept(op.blob) && !op.waits.empty()) fail(where(s) + ": a kept update waits");
  }

  // Each wait has a producer earlier in the order, and it is the right one.
  for (size_t i = 0; i < seq.size(); ++i) {
    const SeqOp& s = seq[i];
    for (const StreamEvent& w : s.op->waits) {
      long last = -1;  // the last record of the event before this wait
      for (size_t j = 0; j < i; ++j)
        if (records(*seq[j].op, w.ev.id, w.ev.blob)) last = long(j);
      if (last < 0) {
        // Never recorded: a no-op wait, harmless only before anything was updated.
        const bool first = std::none_of(seq.begin(), seq.begin() + long(i), [&](const SeqOp& p) {
          return p.op->kind == OpKind::ReadNorms;
        });
        if (!first) fail(where(s) + ": waits for " + to_string(w.ev.id) + " that no earlier operation records");
        continue;
      }
      const int b = w.ev.blob;
      if (w.ev.id == EventId::Landed && seq[size_t(last)].pass != s.pass && s.op->kind == OpKind::Update)
        fail(where(s) + ": waits for the landing of another pass's gradient");
      if (w.ev.id == EventId::Moved)  // no reader of the store queued after its `moved`
        for (size_t j = size_t(last) + 1; j < i; ++j)
          if (seq[j].op->blob == b && reads_store(*seq[j].op))
            fail(where(s) + ": lands while " + where(seq[j]) + " may still read the store");
      if (w.stream == StreamId::D2H && w.ev.id == EventId::Moved && !c.roles[size_t(b)].held)
        fail(where(s) + ": a blob not held waits for moved");
    }
  }

  // A gradient landing in a store an earlier update reads waits for that store's `moved`.
  for (size_t i = 0; i < seq.size(); ++i) {
    const ScheduleOp& op = *seq[i].op;
    if (op.kind != OpKind::SendGrad || kept(op.blob)) continue;
    const bool read_before = std::any_of(seq.begin(), seq.begin() + long(i), [&](const SeqOp& p) {
      return p.op->blob == op.blob && reads_store(*p.op);
    });
    const bool waits = std::any_of(op.waits.begin(), op.waits.end(), [&](const StreamEvent& w) {
      return w.stream == StreamId::D2H && w.ev == EventRef{EventId::Moved, op.blob};
    });
    if (read_before && !waits) fail(where(seq[i]) + ": lands where an earlier update read, without waiting for moved");
  }

  // Uploads: every use or prefetch of a host blob comes after the `upload_gate` record of its
  // master's last writer (that writer's own record, or a later one).
  for (size_t i = 0; i < seq.size(); ++i) {
    std::vector<int> up = seq[i].op->uses;
    if (seq[i].op->prefetch >= 0) up.push_back(seq[i].op->prefetch);
    for (int b : up) {
      if (kept(b)) continue;
      long writer = -1, gate = -1;
      for (size_t j = 0; j < i; ++j) {
        if (seq[j].op->blob == b && writes_master(*seq[j].op)) writer = long(j);
        if (records(*seq[j].op, passes[0]->upload_gate, b)) gate = long(j);
      }
      if (writer >= 0 && gate < writer)
        fail(where(seq[i]) + ": uploads blob " + std::to_string(b) + " without waiting for " + where(seq[size_t(writer)]));
      if (writer >= 0 && seq[size_t(writer)].pass == seq[i].pass && seq[i].op->phase == Phase::Forward)
        fail(where(seq[i]) + ": the forward uses a master its own pass updates");
    }
  }

  // Per pass: gradients sent once each, in backward order; every gradient lands before its
  // update; each blob updated once a step (both passes of a split update, in order); with
  // clipping nothing before the norm.
  for (int p = 0; p < int(passes.size()); ++p) {
    const ScheduleConfig& pc = passes[size_t(p)]->config;
    std::vector<int> sent;
    std::map<int, std::vector<Part>> parts;
    bool norm = false;
    int norms = 0;
    std::map<int, long> sent_at;
    std::vector<int> after_norm, after_backward, deferred;
    std::set<int> early_of;  // blobs whose early span ran this pass
    for (size_t i = 0; i < seq.size(); ++i) {
      const SeqOp& s = seq[i];
      if (s.pass != p) continue;
      const ScheduleOp& op = *s.op;
      if (op.kind == OpKind::ReadNorms) {
        norm = true;
        ++norms;
        if (op.stop_if_not_finite != (pc.mode == UpdateMode::Clipped))
          fail(where(s) + ": stops on a non-finite norm exactly when clipping");
      }
      if (op.kind == OpKind::SendGrad && op.rows == RowsPart::Untouched) {
        // The embedding's first part: after the head's backward, before the lookup's, its chunks
        // updated as they land; the second part (later in the pass) records what the blob's
        // landing and update record.
        const auto later = std::find_if(seq.begin() + long(i) + 1, seq.end(), [&](const SeqOp& o) {
          return o.pass == p && o.op->kind == OpKind::SendGrad && o.op->blob == 0;
        });
        const auto lookup = std::find_if(seq.begin() + long(i) + 1, seq.end(), [&](const SeqOp& o) {
          return o.pass == p && o.op->kind == OpKind::EmbedBackward;
        });
        if (op.blob != 0 || !op.chunk_updates || pc.mode != UpdateMode::AsLanded || kept(0))
          fail(where(s) + ": untouched rows of what is not a host embedding updated as it lands");
        if (!std::any_of(seq.begin(), seq.begin() + long(i),
                         [&](const SeqOp& o) { return o.pass == p && o.op->kind == OpKind::HeadBackward; }))
          fail(where(s) + ": the untouched rows before the head's backward");
        if (later == seq.end() || later->op->rows != RowsPart::Touched || lookup == seq.end() || lookup > later)
          fail(where(s) + ": the untouched rows without the touched ones after the lookup's backward");
        if (!op.records.empty() || !op.waits.empty()) fail(where(s) + ": the untouched rows wait or record an event");
        continue;
      }
      if (op.kind == OpKind::SendGrad) {
        sent.push_back(op.blob);
        sent_at[op.blob] = long(i);
        if (!kept(op.blob) && !record_of(op, EventId::Landed, op.blob)) fail(where(s) + ": a landing not recorded");
        if (op.chunk_updates) {
          parts[op.blob].push_back(Part::All);
          if (pc.mode != UpdateMode::AsLanded) fail(where(s) + ": chunk updates in a pass that is not AsLanded");
          if (!record_of(op, EventId::Updated, op.blob) || !record_of(op, EventId::Moved, op.blob))
            fail(where(s) + ": chunk updates without their updated / moved");
        }
      }
      if (op.kind != OpKind::Update) continue;
      if (op.span == Span::Early) {
        // A held blob's first span, as its gradient lands: after its landing on opt, recording
        // nothing (the rest records what the blob's update records), the rest later in the pass.
        const BlobRole& r = c.roles[size_t(op.blob)];
        if (pc.mode != UpdateMode::AsLanded || !r.held || r.kept || r.disk || op.part != Part::All)
          fail(where(s) + ": an early span of what is not a held host blob in memory updated as it lands");
        const bool waits_landing = std::any_of(op.waits.begin(), op.waits.end(), [&](const StreamEvent& w) {
          return w.stream == StreamId::Opt && w.ev == EventRef{EventId::Landed, op.blob};
        });
        if (!waits_landing) fail(where(s) + ": an early span does not wait for its gradient to land");
        if (!op.records.empty()) fail(where(s) + ": an early span records an event");
        if (!sent_at.count(op.blob)) fail(where(s) + ": an early span before its gradient was sent");
        const auto rest = std::find_if(seq.begin() + long(i) + 1, seq.end(), [&](const SeqOp& o) {
          return o.pass == p && o.op->kind == OpKind::Update && o.op->blob == op.blob;
        });
        if (rest == seq.end() || rest->op->span != Span::Rest) fail(where(s) + ": an early span without its rest");
        early_of.insert(op.blob);
        continue;
      }
      if (op.span == Span::Rest && !early_of.count(op.blob)) fail(where(s) + ": the rest of a span never begun");
      parts[op.blob].push_back(op.part);
      if (pc.mode == UpdateMode::Clipped && !norm) fail(where(s) + ": an update before the norm with clipping");
      if (!sent_at.count(op.blob)) {
        fail(where(s) + ": an update before its gradient was sent");
        continue;
      }
      if (!kept(op.blob) && op.part != Part::Moments) {
        const bool waits_landing = std::any_of(op.waits.begin(), op.waits.end(), [&](const StreamEvent& w) {
          return w.stream == op.stream && w.ev == EventRef{EventId::Landed, op.blob};
        });
        if (!waits_landing) fail(where(s) + ": does not wait for its gradient to land");
        if (!record_of(op, EventId::Updated, op.blob)) fail(where(s) + ": does not record updated");
      }
      if (!kept(op.blob) && op.part != Part::Params && !record_of(op, EventId::Moved, op.blob))
        fail(where(s) + ": does not record moved");
      if (op.part == Part::Moments) {  // after its own parameter pass, on the same stream
        const std::vector<Part>& before = parts[op.blob];
        if (before.size() < 2 || before[before.size() - 2] != Part::Params) fail(where(s) + ": a moment pass before its parameter pass");
      }
      if (op.phase == Phase::AfterNorm) after_norm.push_back(op.blob);
      if (op.phase == Phase::AfterBackward) after_backward.push_back(op.blob);
      if (op.phase == Phase::Deferred) deferred.push_back(op.blob);
    }
    if (pc.backward) {
      std::vector<int> order{head};
      for (int b = head - 1; b >= 0; --b) order.push_back(b);
      if (sent != order) fail("pass " + std::to_string(p) + ": gradients not sent once each, head then layers down then embedding");
    } else if (!sent.empty()) {
      fail("pass " + std::to_string(p) + ": sends gradients without a backward");
    }
    if (norms != 1) fail("pass " + std::to_string(p) + ": not one ReadNorms");
    if (!std::is_sorted(after_norm.begin(), after_norm.end())) fail("pass " + std::to_string(p) + ": updates after the norm not in forward order");
    if (!std::is_sorted(after_backward.begin(), after_backward.end())) fail("pass " + std::to_string(p) + ": held updates not in forward order");
    if (!std::is_sorted(deferred.rbegin(), deferred.rend())) fail("pass " + std::to_string(p) + ": moment passes not in backward order");
    for (int b = 0; b < nb; ++b) {
      const std::vector<Part>& got = parts[b];
      const std::string blob = "pass " + std::to_string(p) + " blob " + std::to_string(b);
      if (pc.mode == UpdateMode::None) {
        if (!got.empty()) fail(blob + ": updated in a pass without updates");
        continue;
      }
      const bool one = got == std::vector<Part>{Part::All} || got == std::vector<Part>{Part::Params, Part::Moments};
      if (!one) fail(blob + ": not updated exactly once");
      if (got.size() == 2 && (kept(b) || c.roles[size_t(b)].disk || !pc.split_update))
        fail(blob + ": split although kept, on disk or the split is off");
    }
  }
  return bad;
}

ModelSpec spec_of(int layers, bool tied) {
  nlohmann::json cfg = test::tiny_config("llama");
  cfg["num_hidden_layers"] = layers;
  cfg["tie_word_embeddings"] = tied;
  return parse_model_spec(cfg, "tiny");
}

struct Mode {
  bool clip, split, held, kept;
};

SlidingOptions options_for(const ModelSpec& spec, const Mode& m, bool disk) {
  SlidingOptions o;
  o.keep_grads = m.clip;
  o.split_update = m.split;
  o.hold_grads = m.held ? int64_t(1) << 40 : 0;  // every host blob but the embedding (held_grad_blobs)
  if (m.held && !m.clip) o.hold_grads = 3000;    // some: the last blobs (forward order)
  if (m.kept) o.gpu_blobs = {0, spec.n_layer + 1};
  if (disk)
    for (int b = 1; b <= spec.n_layer; b += 2) o.disk_blobs.push_back(b);
  return o;
}

std::vector<Mode> all_modes() {
  std::vector<Mode> v;
  for (int i = 0; i < 16; ++i) v.push_back({bool(i & 1), bool(i & 2), bool(i & 4), bool(i & 8)});
  return v;
}

std::string name(const Mode& m) {
  return std::string(m.clip ? "clip" : "noclip") + (m.split ? "_split" : "_fused") + (m.held ? "_held" : "") +
         (m.kept ? "_kept" : "");
}

TEST(StepSchedule, EveryModeKeepsItsInvariantsOverConsecutivePasses) {
  int checked = 0;
  for (int layers : {1, 2, 4})
    for (bool tied : {false, true})
      for (bool disk : {false, true})
        for (const Mode& m : all_modes()) {
          const ModelSpec spec = spec_of(layers, tied);
          const SlidingOptions o = options_for(spec, m, disk);
          const UpdateMode mode = m.clip ? UpdateMode::Clipped : UpdateMode::AsLanded;
          const StepSchedule step = SlidingEngine::schedule(spec, o, mode, true);
          const StepSchedule loss = SlidingEngine::schedule(spec, o, UpdateMode::None, false);
          const std::string label = name(m) + " layers " + std::to_string(layers) + (tied ? " tied" : "") +
                                    (disk ? " disk" : "") + "\n" + describe(step);
          // Steps back to back, an evaluation (loss alone) between two steps, and with gradients
          // kept, the gradients alone (the `grad` command) after a step.
          std::vector<std::vector<const StepSchedule*>> seqs = {{&step, &step, &step}, {&step, &loss, &step, &step}};
          StepSchedule grads;
          if (o.keep_grads) {
            grads = SlidingEngine::schedule(spec, o, UpdateMode::None, true);
            seqs.push_back({&step, &grads, &step});
          }
          for (const auto& seq : seqs) {
            const std::vector<std::string> bad = check(seq);
            EXPECT_TRUE(bad.empty()) << label << "first: " << (bad.empty() ? "" : bad[0]) << " (" << bad.size() << ")";
            ++checked;
          }
        }
  EXPECT_EQ(checked, 3 * 2 * 2 * (8 * 2 + 8 * 3));
}

// The 16 paths are 8 schedules: with clipping every host gradient is held anyway (hold_grads
// changes nothing), and without clipping there is no split update.
TEST(StepSchedule, SixteenPathsAreEightDistinctSchedules) {
  const ModelSpec spec = spec_of(3, false);
  std::set<std::string> distinct;
  for (const Mode& m : all_modes()) {
    const UpdateMode mode = m.clip ? UpdateMode::Clipped : UpdateMode::AsLanded;
    const std::string d = describe(SlidingEngine::schedule(spec, options_for(spec, m, false), mode, true));
    distinct.insert(d);
    Mode other = m;
    if (m.clip) other.held = !m.held;
    else other.split = !m.split;
    EXPECT_EQ(d, describe(SlidingEngine::schedule(spec, options_for(spec, other, false), mode, true))) << name(m);
  }
  EXPECT_EQ(distinct.size(), 8u);
}

// What the modes look like, as the engine runs them (a few anchors of the description).
TEST(StepSchedule, ModesPlaceTheUpdatesWhereTheDesignSays) {
  const ModelSpec spec = spec_of(2, false);  // blobs 0 (embedding), 1, 2, 3 (head)
  auto count = [](const std::vector<ScheduleOp>& ops, OpKind k, Phase ph) {
    return std::count_if(ops.begin(), ops.end(), [&](const ScheduleOp& o) { return o.kind == k && o.phase == ph; });
  };
  // No clipping, nothing held: every host blob updated chunk by chunk as it lands.
  StepSchedule s = SlidingEngine::schedule(spec, options_for(spec, {false, true, false, false}, false),
                                           UpdateMode::AsLanded, true);
  EXPECT_EQ(std::count_if(s.ops.begin(), s.ops.end(), [](const ScheduleOp& o) { return o.chunk_updates; }), 4);
  EXPECT_EQ(count(s.ops, OpKind::Update, Phase::AfterBackward), 0);
  EXPECT_TRUE(s.deferred.empty());
  // Held: the first blobs after the backward, in forward order.
  s = SlidingEngine::schedule(spec, options_for(spec, {false, true, true, false}, false), UpdateMode::AsLanded, true);
  EXPECT_GE(count(s.ops, OpKind::Update, Phase::AfterBackward), 1);
  // Clipping, split: 4 parameter passes after the norm, 4 moment passes deferred; kept blobs on
  // the GPU in one pass; a disk blob fused.
  s = SlidingEngine::schedule(spec, options_for(spec, {true, true, false, true}, true), UpdateMode::Clipped, true);
  EXPECT_EQ(count(s.ops, OpKind::Update, Phase::AfterNorm), 4);
  ASSERT_EQ(s.deferred.size(), 1u);  // layer 2 only: 0 and 3 kept, 1 on disk
  EXPECT_EQ(s.deferred[0].blob, 2);
  EXPECT_EQ(s.deferred[0].part, Part::Moments);
  // The forward ends with the last pass's deferred operations, before the head.
  const auto flush = std::find_if(s.ops.begin(), s.ops.end(), [](const ScheduleOp& o) { return o.kind == OpKind::FlushMoments; });
  const auto headop = std::find_if(s.ops.begin(), s.ops.end(), [](const ScheduleOp& o) { return o.kind == OpKind::HeadBackward; });
  EXPECT_LT(flush, headop);
}

// The embedding's gradient in two parts (SlidingOptions::split_embedding_rows): without clipping,
// when the last layer's gradient is held, its untouched rows go down right after the head's
// backward, the touched ones after the lookup's; not with clipping, nothing held, the embedding
// kept, or the option off. A misplaced part is refused.
TEST(StepSchedule, EmbeddingRowsInTwoPartsWhereTheHostIdles) {
  for (bool tied : {false, true}) {
    const ModelSpec spec = spec_of(3, tied);
    auto parts = [&](const SlidingOptions& o, UpdateMode mode) {
      const StepSchedule s = SlidingEngine::schedule(spec, o, mode, true);
      std::vector<std::pair<RowsPart, OpKind>> v;  // each embedding SendGrad's part and the op before it
      for (size_t i = 1; i < s.ops.size(); ++i)
        if (s.ops[i].kind == OpKind::SendGrad && s.ops[i].blob == 0) v.push_back({s.ops[i].rows, s.ops[i - 1].kind});
      return v;
    };
    SlidingOptions held = options_for(spec, {false, true, true, false}, false);
    held.hold_grads = int64_t(1) << 40;  // every blob but the embedding
    const auto two = parts(held, UpdateMode::AsLanded);
    ASSERT_EQ(two.size(), 2u) << tied;
    EXPECT_EQ(two[0].first, RowsPart::Untouched);
    EXPECT_EQ(two[0].second, OpKind::SendGrad);  // the head's
    EXPECT_EQ(two[1].first, RowsPart::Touched);
    EXPECT_EQ(two[1].second, OpKind::EmbedBackward);
    SlidingOptions off = held;
    off.split_embedding_rows = false;
    EXPECT_EQ(parts(off, UpdateMode::AsLanded).size(), 1u);
    EXPECT_EQ(parts(options_for(spec, {false, true, false, false}, false), UpdateMode::AsLanded).size(), 1u);
    EXPECT_EQ(parts(options_for(spec, {true, true, true, false}, false), UpdateMode::Clipped).size(), 1u);
    SlidingOptions kept = held;
    kept.gpu_blobs = {0};
    EXPECT_EQ(parts(kept, UpdateMode::AsLanded).size(), 1u);

    // The checker: the untouched rows sent before the head's backward, or without the touched ones.
    const StepSchedule good = SlidingEngine::schedule(spec, held, UpdateMode::AsLanded, true);
    ASSERT_TRUE(check({&good, &good, &good}).empty()) << describe(good);
    auto untouched = [](std::vector<ScheduleOp>& ops) {
      return std::find_if(ops.begin(), ops.end(), [](const ScheduleOp& o) { return o.rows == RowsPart::Untouched; });
    };
    StepSchedule early = good;
    ScheduleOp op = *untouched(early.ops);
    early.ops.erase(untouched(early.ops));
    early.ops.insert(early.ops.begin() + 2, op);
    EXPECT_FALSE(check({&early, &early}).empty());
    StepSchedule alone = good;
    for (ScheduleOp& o : alone.ops)
      if (o.rows == RowsPart::Touched) o.rows = RowsPart::All;
    EXPECT_FALSE(check({&alone, &alone}).empty());
  }
}

// Held updates begun as their gradient lands (ScheduleConfig::hold_early): each held host blob in
// memory gets an early span right after its landing (in the head or the backward) and its rest
// after the backward; kept and disk blobs, clipping and a share of 0 have none; the checker
// refuses an early span that does not wait for its landing, a rest that records nothing, and an
// early span queued before its gradient.
TEST(StepSchedule, HeldUpdatesBeginAsTheyLand) {
  int checked = 0, total = 0;
  for (int layers : {1, 2, 4})
    for (bool tied : {false, true})
      for (bool disk : {false, true})
        for (bool kept : {false, true})
          for (bool some : {false, true}) {
            const ModelSpec spec = spec_of(layers, tied);
            SlidingOptions o = options_for(spec, {false, false, true, kept}, disk);
            if (!some) o.hold_grads = int64_t(1) << 40;  // every host blob but the embedding
            o.hold_early = 0.4;
            const StepSchedule step = SlidingEngine::schedule(spec, o, UpdateMode::AsLanded, true);
            const StepSchedule loss = SlidingEngine::schedule(spec, o, UpdateMode::None, false);
            const std::string label = describe(step);
            for (const auto& seq : std::vector<std::vector<const StepSchedule*>>{{&step, &step, &step},
                                                                                  {&step, &loss, &step}}) {
              const std::vector<std::string> bad = check(seq);
              EXPECT_TRUE(bad.empty()) << label << "first: " << (bad.empty() ? "" : bad[0]);
            }
            int want = 0, early = 0, rest = 0;
            for (const BlobRole& r : step.config.roles) want += r.held && !r.kept && !r.disk;
            for (const ScheduleOp& op : step.ops) {
              if (op.kind != OpKind::Update) continue;
              if (op.span == Span::Early) {
                ++early;
                EXPECT_TRUE(op.phase == Phase::Backward || op.phase == Phase::Head) << label;
              }
              if (op.span == Span::Rest) {
                ++rest;
                EXPECT_EQ(op.phase, Phase::AfterBackward) << label;
              }
            }
            total += want;
            EXPECT_EQ(early, want) << label;
            EXPECT_EQ(rest, want) << label;
            ++checked;
          }
  EXPECT_EQ(checked, 48);
  EXPECT_GT(total, 48);  // early spans in most of them

  const ModelSpec spec = spec_of(3, false);
  SlidingOptions o = options_for(spec, {false, false, true, false}, false);
  o.hold_grads = int64_t(1) << 40;
  auto spans = [&](const SlidingOptions& opt, UpdateMode mode) {
    int n = 0;
    for (const ScheduleOp& op : SlidingEngine::schedule(spec, opt, mode, true).ops)
      n += op.kind == OpKind::Update && op.span != Span::Whole;
    return n;
  };
  EXPECT_EQ(spans(o, UpdateMode::AsLanded), 0);  // share 0: as before
  o.hold_early = 1;
  EXPECT_EQ(spans(o, UpdateMode::AsLanded), 2 * 4);  // the head and 3 layers, each early + rest
  SlidingOptions clip = options_for(spec, {true, true, true, false}, false);
  clip.hold_early = 0.5;
  EXPECT_EQ(spans(clip, UpdateMode::Clipped), 0);

  const StepSchedule good = SlidingEngine::schedule(spec, o, UpdateMode::AsLanded, true);
  ASSERT_TRUE(check({&good, &good, &good}).empty()) << describe(good);
  EXPECT_NE(describe(good).find(" early"), std::string::npos);
  auto broken = [&](auto mutate) {
    StepSchedule s = good;
    mutate(s);
    return !check({&s, &s, &s}).empty();
  };
  auto early_of = [](std::vector<ScheduleOp>& ops, int blob) {
    return std::find_if(ops.begin(), ops.end(), [&](const ScheduleOp& op) {
      return op.kind == OpKind::Update && op.span == Span::Early && op.blob == blob;
    });
  };
  EXPECT_TRUE(broken([&](StepSchedule& s) { early_of(s.ops, 2)->waits.clear(); }));
  EXPECT_TRUE(broken([&](StepSchedule& s) {
    for (ScheduleOp& op : s.ops)
      if (op.kind == OpKind::Update && op.span == Span::Rest && op.blob == 3) op.records.clear();
  }));
  EXPECT_TRUE(broken([&](StepSchedule& s) {  // before its gradient is sent
    auto e = early_of(s.ops, 1);
    ScheduleOp op = *e;
    s.ops.erase(e);
    s.ops.insert(s.ops.begin() + 2, op);
  }));
  EXPECT_TRUE(broken([&](StepSchedule& s) {  // an early span without its rest
    for (ScheduleOp& op : s.ops)
      if (op.kind == OpKind::Update && op.span == Span::Rest && op.blob == 2) op.span = Span::Whole;
  }));
}

// The checker is not vacuous: each of these breaks one rule and is found.
TEST(StepSchedule, CheckerRefusesBrokenSchedules) {
  const ModelSpec spec = spec_of(3, true);
  const StepSchedule good =
      SlidingEngine::schedule(spec, options_for(spec, {true, true, false, false}, false), UpdateMode::Clipped, true);
  ASSERT_TRUE(check({&good, &good, &good}).empty());
  auto broken = [&](auto mutate) {
    StepSchedule s = good;
    mutate(s);
    return !check({&s, &s, &s}).empty();
  };
  auto find = [](std::vector<ScheduleOp>& ops, OpKind k, int blob) {
    return std::find_if(ops.begin(), ops.end(), [&](const ScheduleOp& o) { return o.kind == k && o.blob == blob; });
  };
  // A landing that does not wait for the last moment pass to have read the store.
  EXPECT_TRUE(broken([&](StepSchedule& s) { find(s.ops, OpKind::SendGrad, 2)->waits.clear(); }));
  // A parameter pass that does not wait for its gradient.
  EXPECT_TRUE(broken([&](StepSchedule& s) {
    for (ScheduleOp& o : s.ops)
      if (o.kind == OpKind::Update && o.blob == 1) o.waits.clear();
  }));
  // An update that records no `updated`: the next upload would read a stale master.
  EXPECT_TRUE(broken([&](StepSchedule& s) {
    for (ScheduleOp& o : s.ops)
      if (o.kind == OpKind::Update && o.blob == 3) o.records.clear();
  }));
  // The moment passes never deferred (the blob's update is incomplete).
  EXPECT_TRUE(broken([&](StepSchedule& s) { s.deferred.clear(); }));
  // The deferred passes flushed after the head instead of before it (the store is overwritten first).
  EXPECT_TRUE(broken([&](StepSchedule& s) {
    auto f = find(s.ops, OpKind::FlushMoments, -1);
    ScheduleOp op = *f;
    s.ops.erase(f);
    s.ops.insert(find(s.ops, OpKind::LayerBackward, 2), op);
  }));
  // An update before the norm.
  EXPECT_TRUE(broken([&](StepSchedule& s) {
    auto u = find(s.ops, OpKind::Update, 0);
    ScheduleOp op = *u;
    s.ops.erase(u);
    s.ops.insert(find(s.ops, OpKind::ReadNorms, -1), op);
  }));
  // Uploads gated on the wrong event.
  EXPECT_TRUE(broken([&](StepSchedule& s) { s.upload_gate = EventId::Landed; }));
}

}  // namespace
}  // namespace sf
