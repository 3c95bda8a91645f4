// The engine options of the command line (cli/cli_common.h EngineFlags): the sliding engine keeps
// activations (selective recompute) only when --keep-layers or --keep-attention is given — the
// default of -1 is the resident engine's choice (docs/ENGINE.md, "Selective recompute").
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>

#include "cli/cli_common.h"

namespace sf {
namespace {

EngineRequest parsed(const std::string& args) {
  CLI::App app;
  EngineFlags f;
  f.add(&app);
  app.parse(args, false);
  EngineRequest e;
  f.apply(e);
  return e;
}

TEST(EngineFlags, KeptActivationCountsReachThePlanner) {
  const EngineRequest none = parsed("");
  EXPECT_EQ(none.whole_layers, -1);  // the planner's choice, in both engines
  EXPECT_EQ(none.kept_layers, -1);
  const EngineRequest both = parsed("--keep-layers 2 --keep-attention 3");
  EXPECT_EQ(both.whole_layers, 2);
  EXPECT_EQ(both.kept_layers, 3);
  const PlanRequest r = plan_request(EngineOptions{}, both);
  EXPECT_EQ(r.whole_layers, 2);
  EXPECT_EQ(r.kept_layers, 3);
  const PlanRequest d = plan_request(EngineOptions{}, none);
  EXPECT_EQ(d.whole_layers, -1);
  EXPECT_EQ(d.kept_layers, -1);
}

}  // namespace
}  // namespace sf
