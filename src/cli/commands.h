// The slideformer command line: parses arguments, runs a command, maps errors to exit codes
// (0 ok, 1 internal failure, 2 bad input).
#pragma once

namespace sf {
int cli_main(int argc, char** argv);
}
