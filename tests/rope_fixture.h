// A model's RoPE tables on the host for T positions, with their views as the layer program takes
// them (the local layers' too when the model has them). Not copyable: the views point into it.
#pragma once
#include <vector>

#include "model/program.h"
#include "model/rope.h"
#include "test_util.h"

namespace sf::test {

struct HostRope {
  HostRope(const ModelSpec& s, int T) {
    rope_tables(s, T, cos, sin);
    const int64_t half = rope_head_dim(s) / 2;  // Gemma 4: its global layers' head dim
    views = {view_of(cos, {T, half}), view_of(sin, {T, half}), {}, {}};
    if (s.has_local_rope()) {
      rope_tables_local(s, T, cos_l, sin_l);
      views.cos_local = view_of(cos_l, {T, s.head_dim / 2});
      views.sin_local = view_of(sin_l, {T, s.head_dim / 2});
    }
  }
  HostRope(const HostRope&) = delete;
  HostRope& operator=(const HostRope&) = delete;
  std::vector<float> cos, sin, cos_l, sin_l;  // [T, head_dim / 2] each
  RopeTables views;
};

}  // namespace sf::test
