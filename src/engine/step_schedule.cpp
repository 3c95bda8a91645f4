#include "engine/step_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

namespace {

struct Builder {
  const ScheduleConfig& c;
  StepSchedule& s;
  int head() const { return c.layers + 1; }
  const BlobRole& role(int b) const { return c.roles[size_t(b)]; }

  ScheduleOp& add(OpKind k, Phase ph, int blob, StreamId st, std::vector<ScheduleOp>* to = nullptr) {
    std::vector<ScheduleOp>& v = to ? *to : s.ops;
    ScheduleOp op;
    op.kind = k;
    op.phase = ph;
    op.blob = blob;
    op.stream = st;
    v.push_back(op);
    return v.back();
  }

  // The blob's complete gradient: rounded and normed on compute; a host blob's chunks go down on
  // d2h, into its own place (held: once the last update pass has read it) or the ring; without
  // clipping each chunk of a blob not held is updated as it lands. A kept blob without clipping
  // is updated at once, on the GPU.
  void send(int b, Phase ph) {
    const BlobRole& r = role(b);
    if (r.kept) {
      add(OpKind::SendGrad, ph, b, StreamId::Compute);
      if (c.mode == UpdateMode::AsLanded) add(OpKind::Update, ph, b, StreamId::Compute);
      return;
    }
    ScheduleOp& op = add(OpKind::SendGrad, ph, b, StreamId::D2H);
    if (r.held) op.waits.push_back({StreamId::D2H, {EventId::Moved, b}});
    op.records.push_back({StreamId::D2H, {EventId::Landed, b}});
    if (c.mode == UpdateMode::AsLanded && !r.held) {
      op.chunk_updates = true;
      op.records.push_back({StreamId::Opt, {EventId::Updated, b}});
      op.records.push_back({StreamId::Opt, {EventId::Moved, b}});
    }
    if (early(b)) {  // its first share now, on opt behind the work queued there; records nothing
      ScheduleOp& u = add(OpKind::Update, ph, b, StreamId::Opt);
      u.span = Span::Early;
      u.waits.push_back({StreamId::Opt, {EventId::Landed, b}});
    }
  }

  // A held host blob whose update begins as its gradient lands (ScheduleConfig::hold_early).
  bool early(int b) const {
    const BlobRole& r = role(b);
    return c.mode == UpdateMode::AsLanded && c.hold_early > 0 && r.held && !r.kept && !r.disk;
  }

  // A whole-blob update (or one pass of it) once its gradient has landed.
  void update(int b, Phase ph, cpu::AdamWPart part, std::vector<ScheduleOp>* to = nullptr) {
    if (role(b).kept) {
      add(OpKind::Update, ph, b, StreamId::Compute, to);
      return;
    }
    ScheduleOp& op = add(OpKind::Update, ph, b, StreamId::Opt, to);
    op.part = part;
    // A moment pass follows its parameter pass on the same stream: no second wait (fewer
    // operations queued: CUDA blocks the queuing thread once a stream holds too many).
    if (part != cpu::AdamWPart::Moments) op.waits.push_back({StreamId::Opt, {EventId::Landed, b}});
    if (part != cpu::AdamWPart::Moments) op.records.push_back({StreamId::Opt, {EventId::Updated, b}});
    if (part != cpu::AdamWPart::Params) op.records.push_back({StreamId::Opt, {EventId::Moved, b}});
  }
};

}  // namespace

StepSchedule make_step_schedule(const ScheduleConfig& c) {
  const int L = c.layers, nb = L + 2;
  SF_CHECK(L >= 0 && int(c.roles.size()) == nb, "schedule: one role per blob");
  if (c.mode == UpdateMode::Clipped || (c.mode == UpdateMode::None && c.backward))
    for (const BlobRole& r : c.roles)
      SF_CHECK(r.kept || r.held, "schedule: clipping and kept gradients need every host blob's gradient held");
  SF_CHECK(c.backward || c.mode == UpdateMode::None, "schedule: an update needs the backward");
  SF_CHECK(c.hold_early >= 0 && c.hold_early <= 1, "schedule: the held updates' early share is not in [0, 1]");
  const bool emb_rows = c.emb_rows && c.mode == UpdateMode::AsLanded;
  if (emb_rows)
    SF_CHECK(!c.roles[0].kept && !c.roles[0].held && !c.roles[0].disk,
             "schedule: the embedding's rows in two parts need a host embedding, not held, its state in memory");
  StepSchedule s;
  s.config = c;
  Builder b{c, s};
  const int head = b.head();

  b.add(OpKind::BeginPass, Phase::Forward, -1, StreamId::Compute);
  ScheduleOp& emb = b.add(OpKind::EmbedForward, Phase::Forward, 0, StreamId::Compute);
  emb.uses = {0};
  if (L > 0) emb.prefetch = 1;
  for (int l = 0; l < L; ++l) {
    ScheduleOp& op = b.add(OpKind::LayerForward, Phase::Forward, 1 + l, StreamId::Compute);
    op.uses = {1 + l};
    op.prefetch = std::min(2 + l, head);
  }
  if (c.backward) b.add(OpKind::ForwardDone, Phase::Forward, -1, StreamId::D2H);
  // The last step's moment passes: after its parameter passes, before this backward's landings.
  b.add(OpKind::FlushMoments, Phase::Forward, -1, StreamId::Opt);
  // The tied head's table first: with two slots the last layer's prefetch can put the norm in the
  // large slot, and the table, needing that slot, must not be the request that keeps it.
  const std::vector<int> head_uses = c.tied ? std::vector<int>{0, head} : std::vector<int>{head};
  if (!c.backward) {
    b.add(OpKind::HeadLoss, Phase::Head, head, StreamId::Compute).uses = head_uses;
    b.add(OpKind::ReadNorms, Phase::Norm, -1, StreamId::Host);
    return s;
  }
  b.add(OpKind::HeadBackward, Phase::Head, head, StreamId::Compute).uses = head_uses;
  b.send(head, Phase::Head);
  // The embedding's untouched rows: complete now, down on their own stream, updated on opt (FIFO:
  // before the layers' updates: the host idles while the held layers' gradients land).
  if (emb_rows) {
    ScheduleOp& op = b.add(OpKind::SendGrad, Phase::Head, 0, StreamId::D2H);
    op.rows = RowsPart::Untouched;
    op.chunk_updates = true;
  }
  for (int l = L - 1; l >= 0; --l) {
    ScheduleOp& op = b.add(OpKind::LayerBackward, Phase::Backward, 1 + l, StreamId::Compute);
    op.uses = {1 + l};
    if (l > 0) op.prefetch = l;
    b.send(1 + l, Phase::Backward);
  }
  b.add(OpKind::EmbedBackward, Phase::Backward, 0, StreamId::Compute);
  b.send(0, Phase::Backward);
  if (emb_rows) s.ops.back().rows = RowsPart::Touched;
  // Without clipping the held blobs' updates, in forward order: during the next forward, which
  // needs them in that order.
  if (c.mode == UpdateMode::AsLanded)
    for (int i = 0; i < nb; ++i)
      if (!b.role(i).kept && b.role(i).held) {
        b.update(i, Phase::AfterBackward, cpu::AdamWPart::All);
        if (b.early(i)) s.ops.back().span = Span::Rest;
      }
  b.add(OpKind::ReadNorms, Phase::Norm, -1, StreamId::Host).stop_if_not_finite = c.mode == UpdateMode::Clipped;
  if (c.mode != UpdateMode::Clipped) return s;
  // The clip factor is known: every blob's update in forward order (the next forward uploads blob
  // b once its own is done). Split: the parameter passes now, the moment passes in backward order
  // (the order in which the next backward's gradients land on their stores) deferred until the
  // next forward is queued. A disk blob's update is one fused pass (a split would read its
  // moments from the disk twice).
  for (int i = 0; i < nb; ++i) {
    const bool split = c.split_update && !b.role(i).kept && !b.role(i).disk;
    b.update(i, Phase::AfterNorm, split ? cpu::AdamWPart::Params : cpu::AdamWPart::All);
  }
  for (int i = nb - 1; i >= 0; --i)
    if (c.split_update && !b.role(i).kept && !b.role(i).disk)
      b.update(i, Phase::Deferred, cpu::AdamWPart::Moments, &s.deferred);
  return s;
}

int64_t early_elements(int64_t numel, double share) {
  if (!(share > 0) || numel <= 0) return 0;
  if (share >= 1) return numel;
  const int64_t e = int64_t(share * double(numel));
  return std::clamp<int64_t>(e - e % 64, 0, numel);
}

std::vector<SlotRequest> slot_requests(const ScheduleOp& op) {
  std::vector<SlotRequest> r;
  for (size_t i = 0; i < op.uses.size(); ++i) r.push_back({op.uses[i], true, i > 0});
  if (op.prefetch >= 0) r.push_back({op.prefetch, false, op.kind != OpKind::EmbedForward});
  return r;
}

const char* to_string(OpKind k) {
  static const char* const n[] = {"BeginPass",     "EmbedForward",  "LayerForward", "ForwardDone",
                                  "FlushMoments",  "HeadLoss",      "HeadBackward", "LayerBackward",
                                  "EmbedBackward", "SendGrad",      "Update",       "ReadNorms"};
  return n[int(k)];
}

const char* to_string(Phase p) {
  static const char* const n[] = {"forward", "head", "backward", "after-backward", "norm", "after-norm", "deferred"};
  return n[int(p)];
}

const char* to_string(StreamId s) {
  static const char* const n[] = {"host", "compute", "h2d", "d2h", "opt"};
  return n[int(s)];
}

const char* to_string(EventId e) {
  static const char* const n[] = {"landed", "updated", "moved"};
  return n[int(e)];
}

namespace {
void describe_op(std::string& out, const ScheduleOp& op) {
  static const char* const kPart[] = {"", " params", " moments"};
  out += std::string(to_string(op.phase)) + "  " + to_string(op.kind);
  if (op.blob >= 0) out += " " + std::to_string(op.blob);
  if (op.kind == OpKind::Update) out += kPart[int(op.part)];
  if (op.span != Span::Whole) out += op.span == Span::Early ? " early" : " rest";
  out += std::string("  ") + to_string(op.stream);
  for (int u : op.uses) out += "  uses " + std::to_string(u);
  if (op.prefetch >= 0) out += "  prefetch " + std::to_string(op.prefetch);
  if (op.chunk_updates) out += "  chunk updates";
  if (op.rows != RowsPart::All) out += op.rows == RowsPart::Untouched ? "  untouched rows" : "  touched rows";
  if (op.stop_if_not_finite) out += "  stops if not finite";
  for (const StreamEvent& w : op.waits)
    out += std::string("  ") + to_string(w.stream) + " waits " + to_string(w.ev.id) + " " + std::to_string(w.ev.blob);
  for (const StreamEvent& r : op.records)
    out += std::string("  ") + to_string(r.stream) + " records " + to_string(r.ev.id) + " " +
           std::to_string(r.ev.blob);
  out += "\n";
}
}  // namespace

std::string describe(const StepSchedule& s) {
  std::string out;
  for (const ScheduleOp& op : s.ops) describe_op(out, op);
  for (const ScheduleOp& op : s.deferred) describe_op(out, op);
  out += std::string("uploads of blob b wait for ") + to_string(s.upload_gate) + " b\n";
  return out;
}

}  // namespace sf
