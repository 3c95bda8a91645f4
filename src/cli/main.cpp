#include "cli/commands.h"

int main(int argc, char** argv) { return sf::cli_main(argc, argv); }
