// tokenizer.json: validation at load, then a few encodings (the components' code on real text),
// and the input itself encoded as text by the tokenizer it describes (arbitrary bytes, invalid
// UTF-8, long pieces: the encoder's caches and merges see random text), once alone and in a
// batch on two threads (each thread its own scratch and piece cache), which must agree.
#include "data/tokenizer/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  sf::fuzz::expect_input_error_or_success([&] {
    const sf::Tokenizer t = sf::Tokenizer::parse(text, "tokenizer.json");
    for (const char* s :
         {"Hello, world! 123", " \xe2\x96\x81x\xc3\xa9\xef\xbd\x81  \n\t12345 ", "", "<|begin_of_text|>a"})
      (void)t.encode(s);
    const std::string own = text.substr(0, size_t(1) << 16);
    const std::vector<int32_t> alone = t.encode(own, false);
    const auto batch = t.encode_batch({own.substr(0, own.size() / 2), own, own.substr(own.size() / 2)}, false, 2);
    if (batch.size() != 3 || batch[1] != alone) __builtin_trap();  // the same text, the same ids
  });
  return 0;
}
