// `slideformer plan`: the planner's answer for a model directory, a config or a preset.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "engine/make_engine.h"

namespace sf {

struct PlanCliOptions {
  std::string model_dir, preset, config;
  std::string device = "auto";
  int batch_size = 8, seq_len = 2048, grad_accum = 1;
  double max_grad_norm = 1.0;
  bool measure = false;  // measure this machine's rates for the prediction (else the H200's)
  // Another machine's figures (a built-in name or a .json path, docs/HARDWARE.md) instead of measuring:
  // its rates, and its GPU memory and RAM as the budgets where --gpu-memory / --cpu-memory are not given.
  std::string hardware;
  std::string save_hardware;  // with measure: write this machine's figures there (never overwrites)
  // Plan the longest sequence that fits the budgets instead of seq_len (longest_seq_len; seq_len is
  // then the search's upper bound when given, else the model's context or the step-size limit).
  bool longest_seq = false;
  EngineRequest engine;
  SettingNamer names = setting_name;  // how the plan's shortfall names the budgets (the CLI: options)
};
// The sliding engine's predicted phases (Plan::forward, head, backward, step_by) as JSON:
// {"forward_s", "forward_bound", "head_s", "head_bound", "backward_s", "backward_bound", "step_bound"};
// null for the resident engine and where nothing is predicted (the cpu backend).
nlohmann::json phases_json(const Plan& p);
// Prints the plan on stderr; returns it as JSON (fits, engine, slots, bytes, prediction).
nlohmann::json run_plan(const PlanCliOptions& o);

}  // namespace sf
