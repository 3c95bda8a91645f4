// safetensors files: header validation, then every tensor's checksum and bytes read.
#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = sf::fuzz::input_file(data, size, ".safetensors");
  sf::fuzz::expect_input_error_or_success([&] {
    sf::SafetensorsFile f = sf::SafetensorsFile::open(path);
    f.verify_checksums();
    volatile uint8_t sink = 0;
    for (const sf::TensorInfo& t : f.tensors())
      if (t.bytes > 0) sink = sink ^ t.data[0] ^ t.data[t.bytes - 1];  // offsets lie inside the mapping
    (void)sink;
  });
  return 0;
}
