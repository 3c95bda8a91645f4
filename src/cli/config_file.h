// `slideformer COMMAND CONFIG.yaml [key=value ...]`: a flat YAML file of the command's long options
// (`lr: 1e-5`, `seq-len: 2048` or `seq_len: 2048`, `offload: true`), with key=value overrides after
// it, turned into the command line the options parser reads. Only `key: scalar` lines, comments and
// blank lines; anything else is refused with the file and line.
#pragma once
#include <set>
#include <string>
#include <vector>

namespace sf {

// The arguments that stand for the config file and the overrides (flags: "--name" for true,
// nothing for false), leaving out the options in `given` (those on the command line win).
// InputError naming file:line for what is not understood.
std::vector<std::string> config_to_args(const std::string& path, const std::vector<std::string>& overrides,
                                        const std::set<std::string>& given = {});

}  // namespace sf
