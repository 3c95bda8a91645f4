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
  CLI::Option* seq_len_opt = nullptr;  // whether --seq-len was given (--longest-seq's bound)
};

void add_plan_options(CLI::App* c, PlanCli& o) {
  PlanCliOptions& po = o.po;
  c->add_option("--model", po.model_dir, "Hugging Face model directory (its config.json)");
  c->add_option("--preset", po.preset,
                "or a built-in shape: llama-1b, llama-3b, llama-8b, llama-13b, llama-70b, mistral-24b, mistral-123b, "
                "qwen2.5-7b, gemma3-4b, qwen3-30b-a3b, mixtral-8x7b, olmoe-1b-7b");
  c->add_option("--config", po.config, "or a config.json");
  c->add_option("--device", po.device, "cuda, cpu or auto")->capture_default_str();
  c->add_option("--batch-size", po.batch_size)->capture_default_str();
  o.seq_len_opt = c->add_option("--seq-len", po.seq_len)->capture_default_str();
  c->add_option("--grad-accum", po.grad_accum)->capture_default_str();
  c->add_option("--max-grad-norm", po.max_grad_norm, "0 = no clipping")->capture_default_str();
  c->add_flag("--measure", po.measure,
              "measure this machine's rates first (a few seconds; with --offload-dir also its disk) for the prediction");
  c->add_option("--hardware", po.hardware,
                "plan for another machine: a built-in profile (rtx4090, a100-80gb) or a hardware .json file "
                "(docs/HARDWARE.md); its GPU memory and RAM are the budgets unless --gpu-memory / --cpu-memory");
  c->add_option("--save-hardware", po.save_hardware, "with --measure: write this machine's figures to a new .json file");
  c->add_flag("--longest-seq", po.longest_seq,
              "find the longest --seq-len that fits the budgets with the other options as given, and plan it "
              "(searches up to --seq-len when given, else up to the model's context)");
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
            // --longest-seq without --seq-len: search up to the model's context, not the default 2048.
            if (o->po.longest_seq && o->seq_len_opt->count() == 0) o->po.seq_len = 0;
            o->po.names = option_name;
            check_step_sizes(o->po.batch_size, o->po.seq_len, o->po.grad_accum);
            print_json(run_plan(o->po));
            return 0;
          }};
}

}  // namespace sf
