// Chat templates: the input is a template's text, a NUL byte, and a JSON record with "messages"
// (when there is no NUL, the messages are a fixed conversation with a tool call). The template is
// parsed as a model's chat_template, the record read as the dataset reads it, the chat rendered and
// its assistant turns found, and the labels computed with a byte-level tokenizer (the offsets):
// bad input may only be an InputError. The limits are lowered so that one input stays fast.
#include <cstring>

#include "data/template/chat.h"
#include "data/tokenizer/tokenizer.h"
#include "fuzz_common.h"

namespace {

const sf::Tokenizer& tokenizer() {
  static const sf::Tokenizer t = sf::Tokenizer::load(SF_FUZZ_TOKENIZER);
  return t;
}

constexpr const char* kDefaultRecord =
    R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "2+2?"},)"
    R"( {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f",)"
    R"( "arguments": {"b": 1, "a": 12345678901234567890123}}}]}, {"role": "tool", "content": "4"},)"
    R"( {"role": "assistant", "content": "4 \u00e9"}]})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string source = input.substr(0, nul);
  const std::string record = nul == std::string::npos ? std::string(kDefaultRecord) : input.substr(nul + 1);
  sf::fuzz::expect_input_error_or_success([&] {
    sf::jinja::Dict special{{"bos_token", sf::jinja::Value::str("<|begin_of_text|>")},
                            {"eos_token", sf::jinja::Value::str("<|eot_id|>")}};
    sf::ChatTemplate t = sf::ChatTemplate::parse(source, "chat_template.jinja", special);
    t.limits.max_steps = 200'000;
    t.limits.max_output = size_t(1) << 20;
    t.limits.max_items = size_t(1) << 16;
    t.limits.max_value_bytes = uint64_t(64) << 20;
    t.limits.max_iterations = 20'000;
    t.record_steps = 1'000'000;
    const sf::jinja::Value messages = sf::chat_messages(record, "fuzz.jsonl:1");
    const sf::ChatRendering r = sf::render_chat(t, messages, 1725494400, "fuzz.jsonl:1");
    for (const auto& [a, b] : r.assistant)
      if (a > b || b > r.text.size()) __builtin_trap();  // turns lie inside the text
    const std::vector<int32_t> ids = tokenizer().encode(r.text, false);
    const std::vector<int32_t> labels = sf::assistant_labels(tokenizer(), r, ids);
    if (labels.size() != ids.size()) __builtin_trap();
  });
  return 0;
}
