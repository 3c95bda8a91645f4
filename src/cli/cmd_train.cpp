// `slideformer train`: full-parameter fine-tuning with AdamW.
#include <cmath>
#include <memory>

#include "cli/cli_common.h"
#include "core/units.h"

namespace sf {

namespace {

struct TrainCli {
  TrainOptions t;
  EngineFlags flags;
  bool no_shuffle = false;
  std::string max_shard = "5GB";
};

void add_train_options(CLI::App* c, TrainCli& o) {
  TrainOptions& t = o.t;
  add_data_options(c, t.data, o.flags);
  o.flags.add_optimizer_state(c);
  c->add_option("--output", t.output, "output model directory")->required();
  c->add_option("--steps", t.steps, "optimizer steps")->required();
  c->add_option("--lr", t.lr, "peak learning rate")->required();
  c->add_option("--grad-accum", t.grad_accum, "micro-batches per optimizer step")->capture_default_str();
  c->add_option("--weight-decay", t.weight_decay, "decoupled weight decay (all parameters)")->capture_default_str();
  c->add_option("--beta1", t.beta1)->capture_default_str();
  c->add_option("--beta2", t.beta2)->capture_default_str();
  c->add_option("--eps", t.eps)->capture_default_str();
  c->add_option("--warmup-steps", t.warmup_steps)->capture_default_str();
  c->add_option("--lr-schedule", t.lr_schedule, "constant, linear or cosine")->capture_default_str();
  c->add_option("--max-grad-norm", t.max_grad_norm, "global gradient-norm clipping; 0 = off")->capture_default_str();
  c->add_option("--seed", t.seed, "seed of the data order")->capture_default_str();
  c->add_flag("--no-shuffle", o.no_shuffle, "take records in file order");
  c->add_option("--save-every", t.save_every, "also save OUTPUT/checkpoint-STEP every K steps; 0 = off")
      ->capture_default_str();
  c->add_option("--log-every", t.log_every,
                "progress line every K steps when stderr is not a terminal (a terminal gets one line updated "
                "each step); 0 = none")
      ->capture_default_str();
  c->add_option("--metrics", t.metrics,
                "write one JSON line per optimizer step and per evaluation to this file (appended to on --resume)");
  c->add_option("--eval-data", t.eval_data, "held-out JSONL: its loss after training (and every --eval-every)");
  c->add_option("--eval-every", t.eval_every, "also evaluate every K steps; 0 = only at the end")
      ->capture_default_str();
  c->add_option("--resume", t.resume, "continue from OUTPUT/checkpoint-STEP of an earlier run (same data and options)");
  c->add_option("--max-shard-size", o.max_shard, "shard the output above this size")->capture_default_str();
}

int run_train_command(TrainCli& o) {
  TrainOptions& t = o.t;
  apply_data_options(t.data, o.flags);
  t.shuffle = !o.no_shuffle;
  t.max_shard_bytes = parse_size(o.max_shard, "--max-shard-size");
  const TrainResult r = run_train(t);
  if (r.interrupted_by) {
    print_json({{"interrupted", true}, {"steps", r.steps}, {"checkpoint", r.checkpoint}});
    return 128 + r.interrupted_by;  // as the shell reports a signal
  }
  print_json({{"first_loss", r.first_loss},
              {"last_loss", r.last_loss},
              {"steps", r.steps},
              {"tokens_per_second", r.tokens_per_second},
              {"eval_loss", std::isnan(r.eval_loss) ? nlohmann::json() : nlohmann::json(r.eval_loss)},
              {"output", t.output}});
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainCli>();
  auto* c = app.add_subcommand("train", "full-parameter fine-tuning with AdamW");
  add_train_options(c, *o);
  return {c, [o] { return run_train_command(*o); }};
}

}  // namespace sf
