// `slideformer demo`: a tiny Llama-style model (random init) learns 2-digit addition,
// character-level, and reports held-out exact-match accuracy and loss before and after.
#pragma once
#include <cstdint>
#include <string>

namespace sf {

struct DemoOptions {
  std::string output = "slideformer-demo";  // the trained model (and its held-out set) go here
  std::string device = "auto";
  int64_t steps = 800;
  uint64_t seed = 1;
};

struct DemoResult {
  double accuracy_before = 0, accuracy_after = 0;
  double loss_before = 0, loss_after = 0;
};

DemoResult run_demo(const DemoOptions& o);

}  // namespace sf
