// The fast reading of model.vocab and model.merges (data/tokenizer/bpe_scan.h): on every test
// tokenizer it gives what the JSON parser gives (each token's id, each merge's parts, the rest of
// the file), it declines what it does not read exactly (then the tree path reads the file), and a
// tokenizer loaded through it encodes as one loaded through the tree.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer/bpe_scan.h"
#include "data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace sf {
namespace {

std::vector<std::string> tokenizer_files() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(SF_SOURCE_DIR) + "/tests/data/tokenizer")) {
    const std::string p = e.path().string();
    if (e.path().extension() == ".json" && p.find("_cases") == std::string::npos) out.push_back(p);
  }
  return out;
}

// What the scan must give: the parser's vocabulary and merges as (a, b) parts.
void expect_same_as_parser(const std::string& text, const std::string& what) {
  SCOPED_TRACE(what);
  ScannedBpe s;
  ASSERT_TRUE(scan_bpe(text, s));
  const nlohmann::json j = nlohmann::json::parse(text);
  const nlohmann::json& vocab = j["model"]["vocab"];
  ASSERT_EQ(s.vocab.size(), vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) ASSERT_EQ(s.vocab.find(it.key()), it.value().get<int32_t>());
  std::vector<std::pair<std::string, std::string>> want;
  for (const auto& m : j["model"]["merges"]) {
    if (m.is_string()) {
      const std::string t = m;
      if (t.rfind("#version", 0) == 0) continue;
      want.push_back({t.substr(0, t.find(' ')), t.substr(t.find(' ') + 1)});
    } else {
      want.push_back({m[0], m[1]});
    }
  }
  ASSERT_EQ(s.merges.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(s.left(s.merges[i]), want[i].first) << i;
    ASSERT_EQ(s.right(s.merges[i]), want[i].second) << i;
    ASSERT_EQ(s.joined(s.merges[i]), want[i].first + want[i].second) << i;
  }
  nlohmann::json rest = j;
  rest["model"]["vocab"] = nlohmann::json::object();
  rest["model"]["merges"] = nlohmann::json::array();
  EXPECT_EQ(nlohmann::json::parse(s.rest), rest);
}

TEST(BpeScan, GivesWhatTheParserGives) {
  const std::vector<std::string> files = tokenizer_files();
  ASSERT_GT(files.size(), 20u);
  for (const std::string& f : files) {
    const std::string text = test::slurp(f);
    expect_same_as_parser(text, f);
    // The same file written other ways: escaped non-ASCII, indented, merges in the other form,
    // merges before vocab, a "#version" line.
    nlohmann::json j = nlohmann::json::parse(text);
    expect_same_as_parser(j.dump(), f + " compact");
    expect_same_as_parser(j.dump(1, '\t', true), f + " escaped, tabs");
    nlohmann::json& ms = j["model"]["merges"];
    nlohmann::json other = nlohmann::json::array();
    for (const auto& m : ms)
      other.push_back(m.is_string()
                          ? nlohmann::json::array({m.get<std::string>().substr(0, m.get<std::string>().find(' ')),
                                                   m.get<std::string>().substr(m.get<std::string>().find(' ') + 1)})
                          : nlohmann::json(m[0].get<std::string>() + " " + m[1].get<std::string>()));
    nlohmann::json k = j;
    k["model"]["merges"] = other;
    expect_same_as_parser(k.dump(), f + " other merge form");
    if (other.size() > 0 && other[0].is_string()) {
      other.insert(other.begin(), "#version: 0.2");
      k["model"]["merges"] = other;
      expect_same_as_parser(k.dump(), f + " #version");
    }
    nlohmann::ordered_json o = nlohmann::ordered_json::parse(text);
    nlohmann::ordered_json om = nlohmann::ordered_json::object();
    om["merges"] = o["model"]["merges"];
    for (auto it = o["model"].begin(); it != o["model"].end(); ++it)
      if (it.key() != "merges") om[it.key()] = it.value();
    o["model"] = om;
    expect_same_as_parser(o.dump(2), f + " merges first");
  }
}

TEST(BpeScan, DeclinesWhatItDoesNotReadExactly) {
  const std::string base = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})";
  ScannedBpe ok;
  ASSERT_TRUE(scan_bpe(base, ok));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = base;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  const std::vector<std::string> declined = {
      with(R"("b": 1)", R"("a": 1)"),                       // duplicate key (the parser keeps the last)
      with(R"("b": 1)", R"("b": 1.0)"),                     // not a plain integer
      with(R"("b": 1)", R"("b": 1e0)"),                     //
      with(R"("b": 1)", R"("b": -1)"),                      //
      with(R"("b": 1)", R"("b": 01)"),                      // a syntax error
      with(R"("b": 1)", R"("b": 99999999999)"),             // beyond 2^31
      with(R"("b": 1)", R"("b": "1")"),                     //
      with(R"("b": 1)", R"("b\x": 1)"),                     // a bad escape
      with(R"("b": 1)", R"("\ud800": 1)"),                  // a lone surrogate
      with(R"("b": 1)", R"("\udc00\ud800": 1)"),            //
      with(R"("b": 1)", "\"\xC0\x80\": 1"),                 // an overlong form
      with(R"("b": 1)", "\"\xED\xA0\x80\": 1"),             // a surrogate in UTF-8
      with(R"("b": 1)", "\"\xF4\x90\x80\x80\": 1"),         // past U+10FFFF
      with(R"("b": 1)", "\"\xE4\xB8\": 1"),                 // cut short
      with(R"("b": 1)", "\"b\x01\": 1"),                    // a control character
      with(R"("b": 1)", R"("b": 1,)"),                      // a trailing comma
      with(R"(["a b"])", R"(["a b", ["a", "b"]])"),         // mixed merge forms
      with(R"(["a b"])", R"(["a  b"])"),                    // not one space
      with(R"(["a b"])", R"(["ab"])"),                      //
      with(R"(["a b"])", R"([["a", "b", "c"]])"),           //
      with(R"(["a b"])", R"([["a", 1]])"),                  //
      with(R"(["a b"])", R"([5])"),                         //
      with(R"("merges")", R"("m\u0065rges")"),              // an escaped key
      with(R"("vocab": {)", R"("vocab": {}, "vocab": {)"),  // vocab twice
      with(R"({"model")", R"({"model": 1, "model")"),       // model twice
      with(R"("merges": ["a b"])", R"("merges": {})"),      // wrong types
      with(R"("vocab": {"a": 0, "b": 1, "ab": 2})", R"("vocab": [])"),
      with(R"(, "merges": ["a b"])", ""),  // no merges
      base.substr(0, base.size() - 30),    // cut short
  };
  for (const std::string& t : declined) {
    ScannedBpe s;
    EXPECT_FALSE(scan_bpe(t, s)) << t;
  }
  // Escapes it reads, as the parser decodes them.
  const std::string escaped = with(R"("b": 1)", R"("\u00e9\"\\\/\b\f\n\r\t\u0000\ud83d\ude00": 1)");
  ScannedBpe s;
  ASSERT_TRUE(scan_bpe(escaped, s));
  EXPECT_EQ(s.vocab.find(nlohmann::json::parse(escaped)["model"]["vocab"].begin().key()),
            nlohmann::json::parse(escaped)["model"]["vocab"].begin().value().get<int32_t>());
  EXPECT_EQ(s.vocab.find(std::string("\xC3\xA9\"\\/\b\f\n\r\t", 10) + std::string(1, '\0') + "\xF0\x9F\x98\x80"), 1);
}

// A tokenizer read through the scan encodes as one read through the tree (forced by a top-level
// key with an escape, which the scan declines and the loader ignores).
TEST(BpeScan, TokenizerSameAsThroughTheTree) {
  const std::vector<std::string> texts = {"Hello world, 12345 naïve café 😀 中文\n\t  x", " leading", "a\u2581b  c",
                                          std::string("\xff\xfe bytes")};
  int compared = 0;
  for (const std::string& f : tokenizer_files()) {
    SCOPED_TRACE(f);
    const std::string text = test::slurp(f);
    const std::string tree_text = "{\"\\u0078\": null, " + text.substr(text.find('{') + 1);
    ScannedBpe s;
    ASSERT_TRUE(scan_bpe(text, s));
    ASSERT_FALSE(scan_bpe(tree_text, s));
    const Tokenizer fast = Tokenizer::parse(text, f), tree = Tokenizer::parse(tree_text, f);
    EXPECT_EQ(fast.vocab_size(), tree.vocab_size());
    for (const std::string& t : texts) {
      EXPECT_EQ(fast.encode(t), tree.encode(t)) << t;
      std::vector<std::pair<size_t, size_t>> oa, ob;
      EXPECT_EQ(fast.encode_offsets(t, oa), tree.encode_offsets(t, ob)) << t;
      EXPECT_EQ(oa, ob) << t;
      EXPECT_EQ(fast.decode(fast.encode(t)), tree.decode(tree.encode(t))) << t;
      ++compared;
    }
  }
  EXPECT_GT(compared, 80);
}

// A file whose vocabulary or merges fail the checks is refused with the tree path's message.
TEST(BpeScan, ErrorsAreTheTreePaths) {
  const std::string base =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, "added_tokens": []})";
  auto message = [](const std::string& text) {
    try {
      Tokenizer::parse(text, "t.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(base), "accepted");
  const std::pair<std::string, std::string> cases[] = {
      {R"("ab": 2)", R"("ab": 7)"},  // id beyond the number of tokens
      {R"("ab": 2)", R"("ab": 1)"},  // id used twice
      {R"("a b")", R"("a c")"},      // part not in the vocabulary
      {R"("ab": 2)", R"("ac": 2)"},  // result not in the vocabulary
  };
  for (const auto& [from, to] : cases) {
    std::string t = base;
    t.replace(t.find(from), from.size(), to);
    const std::string got = message(t);
    EXPECT_NE(got, "accepted") << t;
    EXPECT_NE(got.find("t.json: model."), std::string::npos) << got;
  }
  EXPECT_NE(message(base.substr(0, base.size() - 1) + "}x").find("invalid JSON"), std::string::npos);
}

}  // namespace
}  // namespace sf
