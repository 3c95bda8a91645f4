// Pieces the command files share: the result line, the engine and data options, and the shape of a
// command (a CLI11 subcommand plus what runs when it was chosen).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/make_engine.h"
#include "train/trainer.h"

namespace sf {

// One subcommand: registered on the app; `run` (after a successful parse) returns the exit code.
// The options live in state owned by `run`, so the registration outlives the add_* call.
struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
};

// One per file of src/cli/: each registers its subcommand and options on `app`.
Command add_init_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_grad_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_demo_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_plan_command(CLI::App& app);

// Prints the result line: the last line of stdout is always one JSON object.
void print_json(const nlohmann::json& j);

// Engine choice and memory budgets, shared by eval, grad, train, bench and plan. Sizes are parsed
// after the command line (a bad size is an input error: exit 2).
struct EngineFlags {
  bool offload = false, no_offload = false;
  int slots = 0, gpu_blobs = -1, keep_attention = -1, keep_layers = -1;   // keep: the planner's choice
  std::string gpu_memory, cpu_memory;
  std::string offload_dir, disk_memory;
  std::string optimizer_state = "fp32";
  std::string upload_copies = "auto";
  void add(CLI::App* c);
  // --optimizer-state (the commands that train or plan training: train, bench, plan).
  void add_optimizer_state(CLI::App* c);
  void apply(EngineRequest& e) const;
};

// --model, --data, --seq-len, ... of the commands that read a data file (eval, grad, train).
void add_data_options(CLI::App* c, DataOptions& d, EngineFlags& f);
// After the parse: the engine flags into d.engine, the data options' checks (paths, step sizes) and
// the record-length limit, before any file is read.
void apply_data_options(DataOptions& d, const EngineFlags& f);

// A command that evaluates a data file (eval, grad): the data options on `c`; when it runs, the
// checked options go to `result`, whose fields are the result line.
Command add_data_command(CLI::App* c, std::function<nlohmann::json(const DataOptions&)> result);

}  // namespace sf
