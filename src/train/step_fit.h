// Limits tied to the plan: a step's size (--grad-accum x --batch-size x --seq-len) is refused up
// front when the planner's engine memory plus the step's token buffers cannot fit the machine, with
// the largest value of the offending option that does fit. Nothing is allocated.
#pragma once
#include <cstdint>

#include "engine/make_engine.h"
#include "model/spec.h"

namespace sf {

// Host bytes of a step's token buffers beyond the engine's own, built before the step runs: ids and
// targets (int32 each) of every token, and each micro-batch's own record (a Batch and its two
// allocations, rounded up), which dominates when sequences are short and grad-accum is huge.
inline constexpr int64_t kStepHostBytesPerToken = 8;
inline constexpr int64_t kStepHostBytesPerMicroBatch = 256;

// eo.max_batch x eo.max_seq tokens per micro-batch, er.grad_accum micro-batches a step. Returns when
// the step fits; otherwise InputError naming the setting (Setting::GradAccum, then BatchSize, then
// SeqLen: the first whose smaller value would fit), what was asked, what it needs and what is
// available, and the largest value that fits. When even one token per step does not fit, it returns
// and build_engine refuses the model with the planner's numbers.
void check_step_fits(const ModelSpec& spec, const EngineOptions& eo, const EngineRequest& er);

}  // namespace sf
