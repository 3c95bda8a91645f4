#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace sf {

std::vector<float> rope_inv_freq(const ModelSpec& s) {
  const int half = s.head_dim / 2;
  const float base = float(s.rope.theta);
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    float expo = float(2 * i) / float(s.head_dim);  // fp32, as torch does
    inv[i] = 1.0f / std::pow(base, expo);
  }
  if (s.rope.type == "linear") {
    for (float& f : inv) f = f / float(s.rope.factor);
  } else if (s.rope.type == "llama3") {
    // Llama 3.1: long wavelengths divided by factor, short kept, a smooth blend between.
    const float factor = float(s.rope.factor);
    const float lo = float(s.rope.low_freq_factor), hi = float(s.rope.high_freq_factor);
    const float old_ctx = float(s.rope.original_max_position);
    const float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    for (float& f : inv) {
      float wavelen = float(2.0 * M_PI) / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      float smooth = (old_ctx / wavelen - lo) / (hi - lo);
      float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  return inv;
}

int rope_head_dim(const ModelSpec& s) {
  // Gemma 4's last layer is always global (transformers forces it), and global layers share one head dim.
  return s.arch == Arch::Gemma4 && !s.gemma4.head_dim.empty() ? s.gemma4.head_dim.back() : s.head_dim;
}

void rope_tables(const ModelSpec& s, int T, std::vector<float>& cos, std::vector<float>& sin) {
  if (s.arch == Arch::Gemma4)
    return rope_tables_from(rope_inv_freq_proportional(s.rope, rope_head_dim(s), s.gemma4.global_rope_fraction), T, cos,
                            sin);
  rope_tables_from(rope_inv_freq(s), T, cos, sin);
}

void rope_tables_from(const std::vector<float>& inv, int T, std::vector<float>& cos, std::vector<float>& sin) {
  const int half = int(inv.size());
  cos.resize(size_t(T) * half);
  sin.resize(size_t(T) * half);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      float angle = inv[i] * float(t);  // one fp32 product, like torch's fp32 outer product
      cos[size_t(t) * half + i] = float(std::cos(double(angle)));
      sin[size_t(t) * half + i] = float(std::sin(double(angle)));
    }
  }
}

std::vector<float> rope_inv_freq_proportional(const RopeSpec& r, int head_dim, double fraction) {
  const int half = head_dim / 2;
  // transformers: rope_angles = int(fraction * head_dim // 2), in doubles.
  const int angles = std::min(half, int(std::floor(fraction * double(head_dim) / 2.0)));
  const float base = float(r.theta);
  const float factor = r.type == "linear" ? float(r.factor) : 1.f;
  std::vector<float> inv(size_t(half), 0.f);
  for (int i = 0; i < angles; ++i) {
    const float expo = float(2 * i) / float(head_dim);  // fp32, as torch does
    inv[size_t(i)] = (1.0f / std::pow(base, expo)) / factor;
  }
  return inv;
}

void rope_tables_local(const ModelSpec& s, int T, std::vector<float>& cos, std::vector<float>& sin) {
  ModelSpec local = s;
  local.rope = s.rope_local;
  // Over head_dim with the local RoPE, for every family (not rope_tables: Gemma 4's is the global one).
  rope_tables_from(rope_inv_freq(local), T, cos, sin);
}

}  // namespace sf
