// config.json: the model spec, its parameter layout (sizes, checked arithmetic) as every command builds it.
#include "fuzz_common.h"
#include "model/layout.h"
#include "model/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sf::fuzz::input_file(data, size, "_config.json");
  sf::fuzz::expect_input_error_or_success([&] {
    const sf::ModelSpec spec = sf::load_model_spec(path);
    (void)sf::make_layout(spec);
  });
  return 0;
}
