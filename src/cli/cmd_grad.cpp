// `slideformer grad`: the fp32 gradient of the eval loss for every parameter, as safetensors.
#include <memory>

#include "cli/cli_common.h"

namespace sf {

namespace {

struct GradCli {
  DataOptions data;
  EngineFlags flags;
  std::string output;
};

int run_grad_command(GradCli& o) {
  apply_data_options(o.data, o.flags);
  const EvalResult r = run_grad(o.data, o.output);
  print_json({{"loss", r.loss}, {"tokens", r.tokens}, {"output", o.output}});
  return 0;
}

}  // namespace

Command add_grad_command(CLI::App& app) {
  auto o = std::make_shared<GradCli>();
  auto* c = app.add_subcommand("grad", "fp32 gradient of the eval loss for every parameter");
  add_data_options(c, o->data, o->flags);
  c->add_option("--output", o->output, "output .safetensors file")->required();
  return {c, [o] { return run_grad_command(*o); }};
}

}  // namespace sf
