// JSONL data: input_ids/labels records, and text/prompt+completion records through a real tokenizer.
#include "data/dataset/dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "fuzz_common.h"

#ifndef SF_FUZZ_TOKENIZER
#error "SF_FUZZ_TOKENIZER: path of a tokenizer.json for text records"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const sf::Tokenizer tok = sf::Tokenizer::load(SF_FUZZ_TOKENIZER);
  static const bool limited = [] {
    sf::set_max_record_bytes(1 << 20);  // keeps single inputs small; the limit itself is tested too
    return true;
  }();
  (void)limited;
  const std::string path = sf::fuzz::input_file(data, size, ".jsonl");
  sf::fuzz::expect_input_error_or_success(
      [&] { (void)sf::load_jsonl(path, 200000, [&]() -> const sf::Tokenizer& { return tok; }); });
  return 0;
}
