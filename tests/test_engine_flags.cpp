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

TEST(EngineFlags, SlidingKeepsActivationsOnlyWhenAsked) {
  const EngineRequest none = parsed("");
  EXPECT_EQ(none.whole_layers, -1);
  EXPECT_EQ(none.kept_layers, -1);
  EXPECT_FALSE(none.offload_keep);
  for (const std::string args : {"--keep-layers -1", "--keep-attention 0", "--keep-layers 2 --keep-attention 3"}) {
    SCOPED_TRACE(args);
    EXPECT_TRUE(parsed(args).offload_keep);
  }
  const EngineRequest both = parsed("--keep-layers 2 --keep-attention 3");
  EXPECT_EQ(both.whole_layers, 2);
  EXPECT_EQ(both.kept_layers, 3);
  EXPECT_TRUE(plan_request(EngineOptions{}, both).offload_keep);  // on to the planner
  EXPECT_FALSE(plan_request(EngineOptions{}, none).offload_keep);
}

}  // namespace
}  // namespace sf
