// The byte-level BPE tokenizer against tools/tokenizer_reference.py (the real regular expressions
// through Python's `regex` module, BPE written independently in Python): small tokenizers of the
// three supported pre-tokenizer patterns and tricky texts, in tests/data/tokenizer (regenerate with
// the script's make-tokenizer and cases commands).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"
#include "io/json_file.h"
#include "test_util.h"

namespace sf {
namespace {

std::string data_dir() { return std::string(SF_SOURCE_DIR) + "/tests/data/tokenizer/"; }

class TokenizerCases : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerCases, PiecesIdsAndRoundTrip) {
  const Tokenizer tok = Tokenizer::load(data_dir() + GetParam() + ".json");
  const nlohmann::json cases = read_json_file(data_dir() + GetParam() + "_cases.json");
  ASSERT_GT(cases.size(), 30u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    SCOPED_TRACE("text: " + text);
    if (!c["pieces"].is_null()) EXPECT_EQ(tok.pre_tokenize(text), c["pieces"].get<std::vector<std::string>>());
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    // Without the BOS the ids decode to the text.
    EXPECT_EQ(tok.decode(tok.encode(text, false)), text);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, TokenizerCases, ::testing::Values("llama3", "qwen2", "gpt2", "sp-legacy", "sp-first"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(Tokenizer, RefusesWhatItDoesNotSupport) {
  test::TempDir d;
  nlohmann::json base = read_json_file(data_dir() + "llama3.json");
  auto refused = [&](nlohmann::json j, const std::string& needle) {
    const std::string path = d.file("t.json");
    std::ofstream(path) << j.dump();
    try {
      Tokenizer::load(path);
      ADD_FAILURE() << "accepted; expected: " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("t.json"), std::string::npos) << e.what();
    }
  };
  nlohmann::json j = base;
  j["model"]["type"] = "Unigram";
  refused(j, "Unigram");
  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  refused(j, "pattern");
  j = base;
  j["normalizer"] = {{"type", "Lowercase"}};
  refused(j, "normalizer");
  j = base;
  j["model"].erase("vocab");
  refused(j, "vocab");
}

}  // namespace
}  // namespace sf
