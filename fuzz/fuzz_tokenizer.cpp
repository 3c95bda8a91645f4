// tokenizer.json: validation at load, then a few encodings (the components' code on real text),
// and the input itself encoded as text by the tokenizer it describes (arbitrary bytes, invalid
// UTF-8, long pieces: the encoder's caches and merges see random text), once alone and in a
// batch on two threads (each thread its own scratch and piece cache), which must agree. And the
// fast reading of model.vocab and model.merges (bpe_scan.h) against the tree: the same input with a
// top-level key the scan declines (an escape in it) must be accepted or refused alike, with the
// same ids.
#include <optional>
#include <vector>

#include "data/tokenizer/tokenizer.h"
#include "fuzz_common.h"

namespace {

// The ids of a few texts, or nullopt when the tokenizer is refused.
std::optional<std::vector<std::vector<int32_t>>> ids_or_refused(const std::string& text) {
  try {
    const sf::Tokenizer t = sf::Tokenizer::parse(text, "tokenizer.json");
    std::vector<std::vector<int32_t>> out;
    for (const char* s : {"Hello, world! 123", " \xe2\x96\x81x\xc3\xa9  \n\t1 ", "\xff<|begin_of_text|>a"})
      out.push_back(t.encode(s));
    return out;
  } catch (const sf::InputError&) {
    return std::nullopt;
  }
}

}  // namespace

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
  const size_t open = text.find_first_not_of(" \t\r\n");
  if (open != std::string::npos && text[open] == '{' && size < (size_t(1) << 20)) {
    const std::string tree = "{\"\\u0078\": null, " + text.substr(open + 1);
    const auto a = ids_or_refused(text), b = ids_or_refused(tree);
    // "{}" has no member to follow the inserted one: "{"x": null, }" is refused, "{}" is too.
    if (a.has_value() != b.has_value() || (a && *a != *b)) __builtin_trap();
  }
  return 0;
}
