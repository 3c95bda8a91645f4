// The sliding engine's schedule of one pass as data (docs/ENGINE.md "The schedule"): the ordered
// operations of a step — forward, head, backward, each gradient's way down, the updates — with the
// stream each is queued on, the blobs it needs in a slot, and the events shared between the parts
// that it waits for and records. SlidingEngine::Impl executes these lists operation by operation
// (it decides nothing about the order itself), and tests/test_step_schedule.cpp checks their
// invariants for every mode (each wait has a producer earlier in the order, every gradient lands
// before its update, each blob is updated once a step, ...).
//
// What varies between the 16 paths (clipping x split update x held gradients x blobs kept on the
// GPU, and blobs whose moments are on disk) is only in this file: make_step_schedule.
// Events private to one part (a slot's `ready`/`released`, the activation ring, the gradient
// staging, the checkpoint fetch buffers, the gradient ring) stay inside that part; the events
// here are the ones one part records and another part's work waits for.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"

namespace sf {

// How a pass ends (what Engine call it serves).
enum class UpdateMode : uint8_t {
  None,      // no update: the loss alone (loss_sum) or the step's gradients kept (compute_grads)
  AsLanded,  // no clipping: a host blob's AdamW chunk by chunk as its gradient lands, during the
             // backward; held blobs after the backward in forward order; kept blobs on the GPU at once
  Clipped,   // clipping: every update after the norm, in forward order (split: the parameter passes,
             // then the moment passes deferred to the next pass's forward)
};

enum class StreamId : uint8_t { Host, Compute, H2D, D2H, Opt };

// The events between parts, one per blob each.
enum class EventId : uint8_t {
  Landed,   // d2h: the blob's whole gradient of this step is in host memory
  Updated,  // opt: the blob's master is written (its next upload may read it)
  Moved,    // opt: the blob's last update pass has read its gradient store (its next landing may overwrite it)
};

struct EventRef {
  EventId id = EventId::Landed;
  int blob = -1;
  bool operator==(const EventRef&) const = default;
};

// `stream` waits for (or records) `ev`.
struct StreamEvent {
  StreamId stream = StreamId::Compute;
  EventRef ev;
};

enum class OpKind : uint8_t {
  BeginPass,      // the kept blobs' gradients and the scalars zeroed; the tokens up; stale slots dropped
  EmbedForward,   // blob 0 for every micro-batch
  LayerForward,   // blob 1 + l for every micro-batch; its input offloaded as a checkpoint (backward)
  ForwardDone,    // the checkpoints' offloads are queued: the backward's fetches wait for them
  FlushMoments,   // the deferred operations of the last pass that had any (its moment passes)
  HeadLoss,       // the loss of every micro-batch (no backward)
  HeadBackward,   // the loss, dy and the head's gradient (the embedding's first part when tied)
  LayerBackward,  // blob 1 + l: recompute + backward for every micro-batch, gradient accumulated
  EmbedBackward,  // the embedding's gradient of every micro-batch
  SendGrad,       // the blob's gradient is complete: rounded, normed; a host blob's lands on d2h
  Update,         // the blob's AdamW (or one pass of it): host blobs on opt, kept blobs on compute
  ReadNorms,      // the pass's one host synchronisation: loss and per-blob squared norms; clip factor
};

enum class Phase : uint8_t { Forward, Head, Backward, AfterBackward, Norm, AfterNorm, Deferred };

// Which rows of the embedding a SendGrad sends (docs/ENGINE.md "The embedding's rows"): all, the
// rows the step's tokens do not touch (complete after the head's backward), or the others.
enum class RowsPart : uint8_t { All, Untouched, Touched };

// Which elements of a held blob an Update covers (docs/ENGINE.md "Held updates begun early"): the
// whole blob, or its first early_elements() as its gradient lands during the backward, or the rest
// after the backward (which records what the blob's update records).
enum class Span : uint8_t { Whole, Early, Rest };

// Elements of a blob of `numel` in its Early span for ScheduleConfig::hold_early `share`: share x
// numel rounded down to a multiple of 64 (a cache line of fp32 for the AdamW's vector loop; any
// split gives the same bits), all of it from share 1 on.
int64_t early_elements(int64_t numel, double share);

struct ScheduleOp {
  OpKind kind = OpKind::BeginPass;
  Phase phase = Phase::Forward;
  int blob = -1;  // the blob it works on (-1: none)
  StreamId stream = StreamId::Compute;
  std::vector<int> uses;  // blobs it needs in a slot (acquired with use; uploads wait for `upload_gate`)
  int prefetch = -1;      // the blob whose upload it starts ahead (-1: none)
  bool chunk_updates = false;  // SendGrad: each chunk's fused AdamW queued on opt as it lands
  RowsPart rows = RowsPart::All;              // SendGrad of the embedding: which of its rows
  cpu::AdamWPart part = cpu::AdamWPart::All;  // Update: both passes, or one of a split update
  Span span = Span::Whole;                    // Update of a held blob: which of its elements
  bool stop_if_not_finite = false;            // ReadNorms: a non-finite loss or norm ends the step here
  std::vector<StreamEvent> waits;             // before its work is queued
  std::vector<StreamEvent> records;           // after its work is queued
};

// What a blob is to the schedule.
struct BlobRole {
  bool kept = false;  // whole on the GPU: no slot, no transfer, GPU AdamW on the compute stream
  bool held = false;  // a host blob whose gradient lands in its own place in the store (clipping or held)
  bool disk = false;  // a host blob whose moments are on disk: always one fused pass
};

struct ScheduleConfig {
  int layers = 0;               // blobs: 0 the embedding, 1..layers, layers + 1 the head
  bool tied = false;            // the head's weight is the embedding's table
  std::vector<BlobRole> roles;  // [layers + 2]
  bool split_update = true;     // SlidingOptions::split_update (clipping)
  // AsLanded: the embedding's gradient goes down in two parts, its untouched rows after the head's
  // backward (on their own stream), the touched ones after the lookup's (a host blob, not held,
  // not on disk).
  bool emb_rows = false;
  // AsLanded: of each held host blob whose state is in memory, this share of its update (its first
  // early_elements) runs on opt as soon as its gradient has landed, during the backward, where the
  // host would otherwise wait for the first blob not held; the rest after the backward as before.
  double hold_early = 0;
  bool backward = true;         // false: the loss alone
  UpdateMode mode = UpdateMode::None;
};

struct StepSchedule {
  ScheduleConfig config;
  std::vector<ScheduleOp> ops;       // queued in this order
  std::vector<ScheduleOp> deferred;  // queued at the next pass's FlushMoments (or before a synchronisation)
  // Every upload of blob b into a slot (h2d) waits for this event of b: the blob's last update.
  EventId upload_gate = EventId::Updated;
};

// The schedule of one pass for these roles and this mode. Clipped and None with the backward need
// every host blob held (their gradients wait for the norm or are read back).
StepSchedule make_step_schedule(const ScheduleConfig& c);

// One request of an operation for a blob in a slot, in the order SlidingEngine::Impl makes them:
// `use` (the operation's kernels read it) or a prefetch (an upload started ahead); `keep_first`:
// it may not replace the slot of the operation's first request. The embedding's forward releases
// its slot before its prefetch; a layer keeps its own while the next one goes up; the tied head
// keeps its norm's while the table comes. The planner replays these over SlotTable to count a
// pass's uploads (SlidingEngine::pass_uploads), which tests check against the engine's.
struct SlotRequest {
  int blob = -1;
  bool use = true;
  bool keep_first = false;
};
std::vector<SlotRequest> slot_requests(const ScheduleOp& op);

const char* to_string(OpKind k);
const char* to_string(Phase p);
const char* to_string(StreamId s);
const char* to_string(EventId e);
// One line an operation: "backward  LayerBackward 3  compute  uses 3 prefetch 2  waits ...".
std::string describe(const StepSchedule& s);

}  // namespace sf
