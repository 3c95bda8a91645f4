// `slideformer init`: a randomly initialised model directory from a config.json.
#include <filesystem>
#include <memory>

#include "backend/device.h"
#include "cli/cli_common.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "engine/resident_engine.h"
#include "io/checkpoint.h"
#include "io/json_file.h"
#include "io/output_lock.h"
#include "io/written_paths.h"
#include "train/model_io.h"
#include "train/train_options_check.h"

namespace sf {

namespace {

namespace fs = std::filesystem;

struct InitOptions {
  std::string config, output, dtype = "fp32";
  uint64_t seed = 0;
};

DType parse_init_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp32" || s == "float32") return DType::F32;
  input_error("--dtype", "unknown dtype '" + s + "' (expected bf16 or fp32)");
}

// The model must fit before anything is allocated or written: the engine holds its fp32 weights in
// host memory (the planner's resident plan for the cpu backend, no gradients or optimizer state), and
// the output's file system must have room for the weights in the output dtype.
void check_init_fits(const ModelSpec& spec, DType dtype, const InitOptions& o) {
  EngineOptions eo;
  eo.training = false;
  eo.optimizer = false;
  EngineRequest er;
  er.device = "cpu";
  er.offload = OffloadChoice::Off;
  const Plan p = make_plan(spec, plan_request(eo, er), plan_backend(eo, er));
  const std::string params = std::to_string(spec.total_params()) + " parameters";
  if (p.host_budget > 0 && p.host_bytes > p.host_budget)
    input_error(o.config, "the model (" + params + ") needs " + format_bytes(p.host_bytes) +
                              " of host memory to initialise, " + format_bytes(p.host_budget) + " available");
  const uint64_t disk = uint64_t(spec.total_params()) * dtype_size(dtype);
  fs::path dir = fs::absolute(o.output);
  while (!dir.empty() && !fs::exists(dir) && dir != dir.root_path()) dir = dir.parent_path();
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && disk > space.available)
    input_error("--output", o.output + ": the model (" + params + ", " + dtype_name(dtype) + ") needs " +
                                format_bytes(disk) + " on disk, " + format_bytes(space.available) + " free there");
}

int run_init(const InitOptions& o) {
  check_path_option("--config", o.config);
  check_path_option("--output", o.output);
  check_written_apart({"--output", o.output}, {{"--config", o.config}});
  const OutputLock lock(o.output);  // one run per output
  claim_output_dir(o.output);       // a directory that is not ours is refused before any work
  const DType dtype = parse_init_dtype(o.dtype);
  nlohmann::json cfg = read_json_file(o.config);
  ModelSpec spec = parse_model_spec(cfg, o.config);
  check_init_fits(spec, dtype, o);
  auto dev = make_cpu_device();
  EngineOptions eo;
  eo.training = false;
  eo.optimizer = false;
  ResidentEngine engine(*dev, spec, eo);
  engine.init_random(o.seed);
  StagedDir staged(o.output);
  save_hf_model(engine, cfg, "", staged.path(), dtype, 5'000'000'000);
  staged.commit();
  log_info("initialised %s (%s, %.2fM parameters, %s)", o.output.c_str(), spec.architecture.c_str(),
           double(spec.total_params()) / 1e6, dtype_name(dtype));
  print_json({{"output", o.output}, {"parameters", spec.total_params()}});
  return 0;
}

}  // namespace

Command add_init_command(CLI::App& app) {
  auto o = std::make_shared<InitOptions>();
  auto* c = app.add_subcommand("init", "random HF-style initialisation of a model from a config.json");
  c->add_option("--config", o->config, "config.json of the model")->required();
  c->add_option("--output", o->output, "output model directory")->required();
  c->add_option("--seed", o->seed, "random seed")->capture_default_str();
  c->add_option("--dtype", o->dtype, "bf16 or fp32")->capture_default_str();
  return {c, [o] { return run_init(*o); }};
}

}  // namespace sf
