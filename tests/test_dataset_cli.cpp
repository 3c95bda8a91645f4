// Chat data through the binary: eval with --train-on assistant|all, the cache file and
// --no-data-cache, `tokenize --jsonl` of chat records, refused templates and options (exit 2).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "chat_fixtures.h"
#include "data/tokenizer/tokenizer.h"
#include "io/json_file.h"
#include "model_fixtures.h"
#include "test_util.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace sf {
namespace {

using test::CmdResult;
using test::slurp;

class DatasetCli : public test::BinaryTest {
 protected:
  DatasetCli() : BinaryTest("sf_dataset_cli_") {}

  // A tiny llama with the test tokenizer (plus the Qwen special tokens) and the Qwen2.5 template.
  std::string make_chat_model() {
    json cfg = test::tiny_config("llama");
    cfg["vocab_size"] = 420;
    std::ofstream(p("m.json")) << cfg.dump();
    const std::string m = p("m");
    EXPECT_EQ(run("init --config " + p("m.json") + " --output " + m + " --seed 3").code, 0);
    const json tok = test::chat_tokenizer_json({"<|im_start|>", "<|im_end|>"});
    std::ofstream(m + "/tokenizer.json") << tok.dump();
    const std::string tmpl = slurp(std::string(SF_SOURCE_DIR) + "/tests/data/chat_templates/qwen2.5.jinja");
    std::ofstream(m + "/tokenizer_config.json") << json({{"eos_token", "<|im_end|>"}, {"chat_template", tmpl}}).dump();
    return m;
  }
};

TEST_F(DatasetCli, ChatDataEvalTrainOnAndCache) {
  const std::string m = make_chat_model();
  const std::string data = p("chat.jsonl");
  std::ofstream(data) << json({{"messages", json::array({{{"role", "system"}, {"content", "S"}},
                                                         {{"role", "user"}, {"content", "What is 2+2?"}},
                                                         {{"role", "assistant"}, {"content", "It is 4."}}})}})
                             .dump()
                      << "\n";
  const CmdResult a = run("eval --model " + m + " --data " + data + " --device cpu");
  ASSERT_EQ(a.code, 0) << a.err;
  const CmdResult all = run("eval --model " + m + " --data " + data + " --device cpu --train-on all --no-data-cache");
  ASSERT_EQ(all.code, 0) << all.err;
  const int64_t ta = a.last()["tokens"], tall = all.last()["tokens"];
  // The assistant turn "It is 4.<|im_end|>\n" is far shorter than the whole rendering.
  EXPECT_GT(ta, 3);
  EXPECT_GT(tall, 3 * ta);
  int caches = 0;
  for (const auto& e : fs::directory_iterator(dir_))
    caches += e.path().filename().string().find("chat.jsonl.sf-cache-") == 0;
  EXPECT_EQ(caches, 1);  // the first run's; --no-data-cache wrote none
  const CmdResult again = run("eval --model " + m + " --data " + data + " --device cpu");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(again.last(), a.last());

  // tokenize --jsonl prints ids and labels of chat records.
  const CmdResult t = run("tokenize --model " + m + " --jsonl " + data);
  ASSERT_EQ(t.code, 0) << t.err;
  const json j = t.last();
  EXPECT_EQ(j["text"].get<std::string>(),
            "<|im_start|>system\nS<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\nIt is 4.<|im_end|>\n");
  const Tokenizer tok = Tokenizer::load(m + "/tokenizer.json");
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), tok.encode(j["text"].get<std::string>(), false));
  std::vector<int32_t> trained;
  for (const auto& x : j["labels"])
    if (x != -100) trained.push_back(x.get<int32_t>());
  EXPECT_EQ(tok.decode(trained), "\nIt is 4.<|im_end|>\n");  // the header's newline: Qwen2.5's TRL convention

  // Bad option value; a template outside the subset: exit 2 naming the file and the construct.
  const CmdResult bad = run("eval --model " + m + " --data " + data + " --device cpu --train-on none");
  EXPECT_EQ(bad.code, 2) << bad.err;
  std::ofstream(m + "/chat_template.jinja") << "{% for m in messages %}{% include 'x' %}{% endfor %}";
  const CmdResult refused = run("eval --model " + m + " --data " + data + " --device cpu");
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_NE(refused.err.find("chat_template.jinja: chat template: line 1: unsupported statement 'include'"),
            std::string::npos)
      << refused.err;
}

}  // namespace
}  // namespace sf
