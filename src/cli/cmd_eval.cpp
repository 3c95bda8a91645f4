// `slideformer eval`: the mean cross-entropy over the trained positions of a data file.
#include "cli/cli_common.h"

namespace sf {

Command add_eval_command(CLI::App& app) {
  auto* c = app.add_subcommand("eval", "mean cross-entropy over the trained positions of a data file");
  return add_data_command(c, [](const DataOptions& d) {
    const EvalResult r = run_eval(d);
    return nlohmann::json{{"loss", r.loss}, {"tokens", r.tokens}, {"engine", r.engine}};
  });
}

}  // namespace sf
