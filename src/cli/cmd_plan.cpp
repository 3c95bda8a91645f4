// `slideformer plan`: where every buffer goes, whether it fits, the predicted speed; allocates nothing.
#include <memory>

#include "cli/cli_common.h"
#include "cli/option_names.h"
#include "train/plan_report.h"
#include "train/train_options_check.h"

namespace sf {

namespace {

struct PlanCli {
  PlanCliOptions po;
  EngineFlags flags;
};

void add_plan_options(CLI::App* c, PlanCli& o) {
  PlanCliOptions& po = o.po;
  c->add_option("--model", po.model_dir, "Hugging Face model directory (its config.json)");
  c->add_option("--preset", po.preset, "or a built-in shape: llama-1b, llama-3b, llama-8b, qwen2.5-7b");
  c->add_option("--config", po.config, "or a config.json");
  c->add_option("--device", po.device, "cuda, cpu or auto")->capture_default_str();
  c->add_option("--batch-size", po.batch_size)->capture_default_str();
  c->add_option("--seq-len", po.seq_len)->capture_default_str();
  c->add_option("--grad-accum", po.grad_accum)->capture_default_str();
  c->add_option("--max-grad-norm", po.max_grad_norm, "0 = no clipping")->capture_default_str();
  c->add_flag("--measure", po.measure, "measure this machine's rates first (a few seconds) for the prediction");
  o.flags.add(c);
  o.flags.add_optimizer_state(c);
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanCli>();
  auto* c = app.add_subcommand("plan", "where every buffer goes, whether it fits, predicted speed; allocates nothing");
  add_plan_options(c, *o);
  return {c, [o] {
            o->flags.apply(o->po.engine);
            o->po.names = option_name;
            check_step_sizes(o->po.batch_size, o->po.seq_len, o->po.grad_accum);
            print_json(run_plan(o->po));
            return 0;
          }};
}

}  // namespace sf
