// `slideformer eval`: the mean cross-entropy over the trained positions of a data file.
#include <memory>

#include "cli/cli_common.h"

namespace sf {

namespace {

struct EvalCli {
  DataOptions data;
  EngineFlags flags;
};

int run_eval_command(EvalCli& o) {
  apply_data_options(o.data, o.flags);
  const EvalResult r = run_eval(o.data);
  print_json({{"loss", r.loss}, {"tokens", r.tokens}});
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalCli>();
  auto* c = app.add_subcommand("eval", "mean cross-entropy over the trained positions of a data file");
  add_data_options(c, o->data, o->flags);
  return {c, [o] { return run_eval_command(*o); }};
}

}  // namespace sf
