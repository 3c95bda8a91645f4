// `slideformer bench`: training throughput on synthetic weights (no files needed).
#include <memory>

#include "cli/cli_common.h"
#include "train/bench.h"
#include "train/train_options_check.h"

namespace sf {

namespace {

struct BenchCli {
  BenchOptions bo;
  EngineFlags flags;
};

void add_bench_options(CLI::App* c, BenchCli& o) {
  BenchOptions& bo = o.bo;
  c->add_option("--preset", bo.preset,
                "llama-1b, llama-3b, llama-8b, llama-13b, llama-70b, mistral-24b, mistral-123b, qwen2.5-7b, gemma3-4b, "
                "qwen3-30b-a3b, mixtral-8x7b or olmoe-1b-7b")
      ->capture_default_str();
  c->add_option("--config", bo.config, "a config.json instead of a preset");
  c->add_option("--device", bo.device)->capture_default_str();
  c->add_option("--batch-size", bo.batch_size)->capture_default_str();
  c->add_option("--seq-len", bo.seq_len)->capture_default_str();
  c->add_option("--grad-accum", bo.grad_accum, "micro-batches per optimizer step")->capture_default_str();
  c->add_option("--steps", bo.steps, "timed steps")->capture_default_str();
  c->add_option("--warmup", bo.warmup, "untimed steps first")->capture_default_str();
  c->add_option("--layers", bo.layers, "override the number of layers");
  o.flags.add(c);
  o.flags.add_optimizer_state(c);
  c->add_option("--max-grad-norm", bo.max_grad_norm, "gradient clipping (0 = off: overlapped update)")
      ->capture_default_str();
  c->add_flag("--profile-ops", bo.profile_ops,
              "time every op of the timed steps (CUDA events around each) and print the table against the step");
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchCli>();
  auto* c = app.add_subcommand("bench", "training throughput on synthetic weights (no files needed)");
  add_bench_options(c, *o);
  return {c, [o] {
            o->flags.apply(o->bo.engine);
            check_step_ranges(o->bo.batch_size, o->bo.seq_len, o->bo.grad_accum);  // then check_step_fits
            print_json(run_bench(o->bo));
            return 0;
          }};
}

}  // namespace sf
