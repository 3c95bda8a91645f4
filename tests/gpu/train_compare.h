// What the GPU tests of the sliding engine's host-side variants share: three training steps of a
// sliding engine, and the comparison of a variant's run against the plain one's, held to twice the
// plain engine's own run-to-run difference (the attention backward adds dQ with fp32 atomics, so
// steps after the first differ in their last bits from run to run), or 1e-6 relative where those
// runs agree exactly; the first step's loss bit for bit (its weights are the same).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../engine_state.h"
#include "data/dataset/dataset.h"
#include "engine/sliding_engine.h"

namespace sf::test {

struct Trained {
  std::vector<double> losses;
  NamedTensors params;
  Engine::Stats stats;
};

// Steps 1..3 of `e` (initialised with seed 5), two of `recs` a step (records 0..5, 11 tokens),
// lr 1e-2, weight decay 0.1, clipping at `clip` (0: none).
inline Trained train_three_steps(Engine& e, const std::vector<Record>& recs, double clip) {
  e.init_random(5);
  Trained t;
  for (int s = 1; s <= 3; ++s) {
    const std::vector<Batch> mbs = {make_batch({&recs[size_t(2 * s - 2)], &recs[size_t(2 * s - 1)]}, 11)};
    Engine::StepParams p;
    p.adamw.lr = 1e-2f;
    p.adamw.weight_decay = 0.1f;
    p.adamw.step = s;
    p.max_grad_norm = clip;
    const Engine::StepResult r = e.step(mbs, p);
    EXPECT_TRUE(r.updated);
    t.losses.push_back(r.loss);
  }
  t.params = export_params(e);
  t.stats = e.stats();
  return t;
}

struct Difference {
  double worst = 0;  // of the trained masters, relative to the largest
  double noise = 0;  // the plain engine's run-to-run difference
};

// `variant` against `plain` (and `again`, a second run of the plain engine).
inline Difference expect_as_plain(const Trained& plain, const Trained& again, const Trained& variant) {
  EXPECT_EQ(variant.losses.size(), plain.losses.size());
  if (variant.losses.empty() || variant.losses.size() != plain.losses.size()) return {};
  EXPECT_EQ(variant.losses[0], plain.losses[0]) << "the first step's weights are the same: so is its loss";
  Difference d;
  d.noise = worst_relative(plain.params, again.params);
  d.worst = worst_relative(plain.params, variant.params);
  EXPECT_LE(d.worst, std::max(2 * d.noise, 1e-6)) << "run-to-run " << d.noise;
  for (size_t s = 1; s < plain.losses.size(); ++s) {
    const double ln = std::fabs(plain.losses[s] - again.losses[s]);
    EXPECT_LE(std::fabs(variant.losses[s] - plain.losses[s]), std::max(2 * ln, 1e-6 * std::fabs(plain.losses[s])))
        << "step " << s + 1;
  }
  return d;
}

}  // namespace sf::test
