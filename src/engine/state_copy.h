// One tensor of an engine's state between device memory, in the state's dtype, and the fp32 host
// array the Engine interface speaks (read_state / write_state): BF16 AdamW moments (compact
// optimizer state) widen exactly and narrow to nearest-even (exact for values that were bf16, as a
// saved bf16 state's are). Both wait for the stream.
#pragma once
#include <cstdint>

#include "backend/device.h"
#include "model/layout.h"

namespace sf {

// [first, first + count) inside the entry (Engine::read_state_part / write_state_part).
void check_state_part(const BlobEntry& e, int64_t first, int64_t count);

// dst [n] F32 <- src [n] t, device memory.
void state_to_f32(Device& dev, Stream& s, const void* src, DType t, int64_t n, float* dst);
// dst [n] t, device memory <- src [n] F32.
void state_from_f32(Device& dev, Stream& s, void* dst, DType t, int64_t n, const float* src);

}  // namespace sf
