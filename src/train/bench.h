// `slideformer bench`: training throughput on synthetic weights and tokens (no files needed).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/make_engine.h"

namespace sf {

struct BenchOptions {
  std::string preset = "llama-1b";  // or a config.json path in `config`
  std::string config;
  std::string device = "auto";
  int batch_size = 8, seq_len = 2048;
  int grad_accum = 1;  // micro-batches per optimizer step
  int64_t steps = 10, warmup = 3;
  int layers = 0;        // override num_hidden_layers (0 = keep)
  EngineRequest engine;  // engine choice and budgets (its device and clip are set from the above)
  // Clip the gradient norm to this (HF's default 1.0); 0 = no clipping, which lets the sliding
  // engine run each blob's AdamW during the backward. The norm is computed either way (the
  // trainer logs it), as in `train`.
  double max_grad_norm = 1.0;
  // Time every op of the timed steps and print the table (backend/op_profile.h) against the step.
  bool profile_ops = false;
};

// Runs warmup + timed steps of the full training step (forward, loss, backward, AdamW) and
// returns {"tokens_per_second", "step_ms", "device_bytes", ...}.
nlohmann::json run_bench(const BenchOptions& o);

}  // namespace sf
