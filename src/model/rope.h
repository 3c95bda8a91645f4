// RoPE cos/sin tables as Hugging Face computes them (fp32 inverse frequencies, fp32 angles),
// with default, linear and llama3 frequency scaling.
#pragma once
#include <vector>

#include "model/spec.h"

namespace sf {

// inv_freq [head_dim/2], after scaling.
std::vector<float> rope_inv_freq(const ModelSpec& s);
// cos, sin: [T, head_dim/2] row-major, positions 0..T-1.
void rope_tables(const ModelSpec& s, int T, std::vector<float>& cos, std::vector<float>& sin);
// The same for the local (sliding-window) layers' RoPE, s.rope_local (Gemma 3).
void rope_tables_local(const ModelSpec& s, int T, std::vector<float>& cos, std::vector<float>& sin);

}  // namespace sf
