// The YAML option file of `slideformer COMMAND CONFIG.yaml`, with an override.
#include "cli/config_file.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sf::fuzz::input_file(data, size, ".yaml");
  sf::fuzz::expect_input_error_or_success([&] { (void)sf::config_to_args(path, {"lr=1e-5"}, {"seed"}); });
  return 0;
}
