// The sliding engine's gradient path (docs/ENGINE.md "Gradients"), from the backward's kernels to
// the host optimizer. A blob's gradient accumulates in fp32 on the GPU over the step's
// micro-batches (two alternating layer accumulators, one each for the embedding and the head; a
// blob kept whole on the GPU accumulates in its own gradient buffer, given by the engine, or, a
// layer in a compute dtype below fp32, in a layer accumulator and is kept rounded). Once
// complete it is rounded to the compute dtype chunk by chunk through a GPU staging buffer (in
// place too, so that the norm sees the rounded values, as the resident engine does), its squared
// norm is taken on the GPU, and its chunks go down on d2h into the host optimizer's store or ring
// (HostOptimizer::land); without clipping each chunk's AdamW is queued on the opt stream as it
// lands, else the whole blob's (or one pass of it) after the backward (queue_update).
//
// Owns: the accumulators and the staging (its buffers(), which the engine lists) and the events
// between compute, d2h and opt for them. The events other parts wait for — a blob's `landed`,
// `updated`, `moved` — are the schedule's (engine/step_schedule.h): the engine waits for and
// records them around these calls, as the schedule says. Queues nothing but on the streams it is
// given.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/device.h"
#include "engine/buffers.h"
#include "engine/host_optimizer.h"

namespace sf {

class StepTrace;

struct GradientPathOptions {
  int64_t max_layer = 0;  // elements of the largest layer that accumulates here (the two layer accumulators)
  int64_t emb = 0;        // elements of the embedding's accumulator (0: kept on the GPU)
  int64_t head = 0;       // elements of the head's accumulator (0: kept on the GPU)
  DType act = DType::F32;  // the gradients on their way down (staging when below fp32)
  int64_t chunk = 1;       // elements a staging / transfer chunk
  // The embedding's gradient in two parts (docs/ENGINE.md "The embedding's rows"): elements a
  // chunk of the first part, which goes down on a stream of its own (0: the embedding goes down
  // whole, as the other blobs).
  int64_t early_chunk = 0;
};

class GradientPath {
 public:
  enum class Acc { Layer, Embedding, Head };  // which accumulator a blob's gradient uses
  struct Streams {
    Stream &compute, &d2h, &opt;
  };
  // `norms` [blobs] F32 on the device: each blob's squared norm; `trace` may be null.
  GradientPath(Device& dev, const GradientPathOptions& o, Streams streams, HostOptimizer& host, float* norms,
               StepTrace* trace);
  // What the constructor allocates: "acc.layer" x 2, "acc.emb", "acc.head" (fp32, 256-aligned),
  // "grad.staging" (2 chunks in the compute dtype, when it is below fp32), "grad.early_staging"
  // (the same for the embedding's first part, when it has one).
  static MemoryItems buffers(const GradientPathOptions& o);

  // A blob's gradient for this step, zeroed on the compute stream once the accumulator's last
  // contents have left (`kept`: the blob's own gradient on the GPU, already zeroed by the step;
  // `kept_low`: a kept layer's gradient in the compute dtype, [numel], written by send from an
  // accumulator).
  struct Grad {
    Tensor g;      // [numel] F32
    int acc = -1;  // the accumulator (-1: kept on the GPU, accumulating in place)
    Tensor low;    // [numel] act: where send rounds a kept layer's gradient to (else empty)
  };
  Grad fresh(Acc which, int64_t numel, float* kept, void* kept_low = nullptr);
  // `g` is complete on the compute stream: rounded, normed and (host blobs) sent down on d2h or
  // (a kept layer's, `low`) written to the GPU in the compute dtype,
  // with `update_chunks` each chunk's fused AdamW (parameters `p`) queued on opt as it lands.
  // For a kept blob the caller queues its GPU AdamW after this.
  // `rows`: only those rows' elements are updated (the embedding's second part).
  void send(int blob, const Grad& g, bool update_chunks, const AdamWParams& p, const UpdateRows& rows = {});
  // The embedding's first part: once the head's backward is queued, the rows of `g` that the
  // step's tokens do not touch (`rows.want` 0: their gradient is complete) go down chunk by chunk
  // on a stream of their own, rounded through their own staging (g itself is not rounded: the
  // lookup's backward still adds to the other rows), and their AdamW is queued on opt as each
  // lands. The compute stream waits for none of it; before the lookup's backward writes g, it
  // calls before_rows_written.
  void send_early(int blob, const Grad& g, const AdamWParams& p, const UpdateRows& rows);
  // compute waits until the first part has read g.
  void before_rows_written();
  // A held blob's AdamW (or one pass of it) over its elements [i0, i0 + n) on the opt stream,
  // queued after the caller made opt wait for the blob's landing.
  void queue_update(int blob, int64_t i0, int64_t n, const AdamWParams& p, cpu::AdamWPart part = cpu::AdamWPart::All);

  size_t device_bytes() const;

 private:
  void round_kept(Tensor g);
  void mark(Stream& s, const char* name, const char* what, int index, const char* suffix = "");
  struct Accumulator {
    DeviceBuffer buf;             // [numel] F32
    std::unique_ptr<Event> sent;  // d2h: copied down
  };
  Device& dev_;
  DType act_;
  int64_t chunk_;
  Streams s_;
  HostOptimizer& host_;
  float* norms_;
  StepTrace* trace_;
  Accumulator acc_[4];  // two layers (alternating: one fills while the other drains), embedding, head
  int next_layer_ = 0;
  DeviceBuffer staging_;  // [2, chunk] act (act != F32)
  size_t staging_stride_ = 0;
  std::unique_ptr<Event> stg_ready_[2], stg_free_[2];
  int next_stg_ = 0;
  std::unique_ptr<Event> grads_ready_;           // compute: a gradient is complete (re-recorded)
  std::unique_ptr<Event> chunk_landed_;  // d2h, re-recorded per chunk (waited at once)
  // The embedding's first part (early_chunk > 0).
  int64_t early_chunk_ = 0;
  std::unique_ptr<Stream> early_;  // its copies down (and roundings)
  DeviceBuffer early_staging_;     // [2, early_chunk] act (act != F32)
  size_t early_stride_ = 0;
  std::unique_ptr<Event> early_free_[2];  // early: staging buffer i copied down
  std::unique_ptr<Event> early_ready_;    // compute: the head's part of the gradient is complete
  std::unique_ptr<Event> early_read_;     // early: the last read of the gradient
  std::unique_ptr<Event> early_landed_;   // early, re-recorded per chunk (waited at once)
  int early_next_ = 0;
};

}  // namespace sf
