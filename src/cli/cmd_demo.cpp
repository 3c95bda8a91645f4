// `slideformer demo`: a tiny model learns 2-digit addition (CPU or GPU).
#include <memory>

#include "cli/cli_common.h"
#include "train/demo.h"

namespace sf {

Command add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  auto* c = app.add_subcommand("demo", "a tiny model learns 2-digit addition (CPU or GPU)");
  c->add_option("--output", o->output, "where the trained model goes")->capture_default_str();
  c->add_option("--device", o->device, "cpu, cuda or auto")->capture_default_str();
  c->add_option("--steps", o->steps)->capture_default_str();
  c->add_option("--seed", o->seed)->capture_default_str();
  return {c, [o] {
            const DemoResult r = run_demo(*o);
            print_json({{"accuracy_before", r.accuracy_before},
                        {"accuracy_after", r.accuracy_after},
                        {"loss_before", r.loss_before},
                        {"loss_after", r.loss_after}});
            return 0;
          }};
}

}  // namespace sf
