// The machine's rates the planner predicts with, measured in a few seconds (`plan --measure`):
// host AdamW and memory read (all cores), and with a GPU: pinned PCIe both ways at once, the
// GEMM rate of a layer-sized product (the model rate is that times the 1B step's measured
// efficiency, docs/ENGINE.md) and our causal attention kernel's forward and backward rates at a
// long-sequence shape (2 x 8192 tokens, 32/8 heads of 128).
#pragma once
#include <string>

#include "engine/planner.h"

namespace sf {

// The model rate over the layer GEMM's rate: the 1B in-memory step over its FLOPs (500 TFLOP/s)
// against cuBLAS on its layer GEMMs (727), H200 machine (docs/ENGINE.md).
constexpr double kStepEfficiency = 500.0 / 727.0;

struct MeasuredRates {
  Rates rates;
  double gemm_tflops = 0;  // 0: no GPU measured
  std::string summary;     // one line for the log
};

// device: "cpu", "cuda" or "auto". The host figures are measured always.
MeasuredRates measure_rates(const std::string& device);

}  // namespace sf
