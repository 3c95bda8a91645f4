// RoPE cos/sin tables as Hugging Face computes them (fp32 inverse frequencies, fp32 angles),
// with default, linear and llama3 frequency scaling.
#pragma once
#include <vector>

#include "model/spec.h"

namespace sf {

// inv_freq [head_dim/2], after scaling.
std::vector<float> rope_inv_freq(const ModelSpec& s);
// The head dim of the (global) tables rope_tables builds: head_dim, except Gemma 4's global
// layers' own (its local layers' tables stay at head_dim).
int rope_head_dim(const ModelSpec& s);
// cos, sin: [T, rope_head_dim/2] row-major, positions 0..T-1 (Gemma 4: its global layers'
// proportional RoPE).
void rope_tables(const ModelSpec& s, int T, std::vector<float>& cos, std::vector<float>& sin);
// The same for the local (sliding-window) layers' RoPE, s.rope_local (Gemma 3).
void rope_tables_local(const ModelSpec& s, int T, std::vector<float>& cos, std::vector<float>& sin);

// Gemma 4's global layers (transformers' "proportional" RoPE): inv_freq [head_dim/2] whose first
// int(fraction * head_dim / 2) entries are theta^(-2i / head_dim) / factor (the exponent over the
// whole head, not over the rotated part) and the rest 0. A zero frequency gives cos 1, sin 0: those
// pairs pass unrotated through the ordinary RoPE kernels, so partial RoPE needs no kernel of its own.
// r.type "linear" carries the factor ("default": 1).
std::vector<float> rope_inv_freq_proportional(const RopeSpec& r, int head_dim, double fraction);
// cos, sin [T, inv.size()] from inverse frequencies, as rope_tables computes them.
void rope_tables_from(const std::vector<float>& inv, int T, std::vector<float>& cos, std::vector<float>& sin);

}  // namespace sf
