// tokenizer.json: validation at load, then a few encodings (the components' code on real text).
#include "data/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  sf::fuzz::expect_input_error_or_success([&] {
    const sf::Tokenizer t = sf::Tokenizer::parse(text, "tokenizer.json");
    for (const char* s :
         {"Hello, world! 123", " \xe2\x96\x81x\xc3\xa9\xef\xbd\x81  \n\t12345 ", "", "<|begin_of_text|>a"})
      (void)t.encode(s);
  });
  return 0;
}
