#include "cli/commands.h"

#include <cstdio>

namespace sf {
int cli_main(int, char**) {
  std::fprintf(stderr, "slideformer: not yet\n");
  return 1;
}
}  // namespace sf
