// `slideformer grad`: the fp32 gradient of the eval loss for every parameter, as safetensors.
#include <memory>

#include "cli/cli_common.h"

namespace sf {

Command add_grad_command(CLI::App& app) {
  auto output = std::make_shared<std::string>();
  auto* c = app.add_subcommand("grad", "fp32 gradient of the eval loss for every parameter");
  Command cmd = add_data_command(c, [output](const DataOptions& d) {
    const EvalResult r = run_grad(d, *output);
    return nlohmann::json{{"loss", r.loss}, {"tokens", r.tokens}, {"output", *output}, {"engine", r.engine}};
  });
  c->add_option("--output", *output, "output .safetensors file")->required();
  return cmd;
}

}  // namespace sf
