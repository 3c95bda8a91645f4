// load_jsonl with tokenized records: chat records (labels on the assistant turns), parallel
// tokenization equal to one record at a time, and the tokenized-dataset cache (hit, miss after a
// change, corrupt cache ignored and rebuilt, disabled).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "chat_fixtures.h"
#include "core/error.h"
#include "data/dataset/dataset.h"
#include "data/template/chat.h"
#include "data/tokenizer/tokenizer.h"
#include "io/json_file.h"
#include "test_util.h"

using namespace sf;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr std::time_t kDatasetNow = 1725494400;  // 2024-09-05

Tokenizer dataset_chat_tokenizer() {
  return Tokenizer::parse(test::chat_tokenizer_json().dump(), "chat_tokenizer.json");
}

ChatTemplate qwen25() {
  const std::string p = std::string(SF_SOURCE_DIR) + "/tests/data/chat_templates/qwen2.5.jinja";
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ChatTemplate::parse(ss.str(), p, {{"eos_token", jinja::Value::str("<|im_end|>")}});
}

struct Fixture {
  Tokenizer tok = dataset_chat_tokenizer();
  ChatTemplate chat = qwen25();
  int tokenizer_loads = 0;
  LoadOptions opts(bool cache = true) {
    LoadOptions o;
    o.tokenizer = [this]() -> const Tokenizer& {
      ++tokenizer_loads;
      return tok;
    };
    o.chat_template = [this]() -> const ChatTemplate* { return &chat; };
    o.cache = cache;
    o.now = kDatasetNow;
    return o;
  }
};

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

std::string mixed_data(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    const std::string k = std::to_string(i);
    switch (i % 4) {
      case 0:
        s += json({{"text",
                    "record " + k + " h\xC3\xA9llo w\xC3\xB6rld \xF0\x9F\x98\x80 " + std::string(size_t(i % 7), 'x')}})
                 .dump();
        break;
      case 1:
        s += json({{"prompt", "Q" + k + ": "}, {"completion", " answer " + k}}).dump();
        break;
      case 2:
        s += json({{"messages", json::array({{{"role", "user"}, {"content", "hi " + k}},
                                             {{"role", "assistant"}, {"content", "yo " + k}},
                                             {{"role", "user"}, {"content", "again"}},
                                             {{"role", "assistant"}, {"content", "ok"}}})}})
                 .dump();
        break;
      default:
        s += json({{"input_ids", {1, 2, 3, i % 50}}}).dump();
    }
    s += '\n';
  }
  return s;
}

void expect_same(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.records.size(), b.records.size());
  for (size_t k = 0; k < a.records.size(); ++k) {
    EXPECT_EQ(a.records[k].ids, b.records[k].ids) << k;
    EXPECT_EQ(a.records[k].labels, b.records[k].labels) << k;
  }
}

TEST(DatasetChat, ChatRecordsTrainOnlyAssistantTurns) {
  test::TempDir d;
  Fixture f;
  const fs::path p = d.path / "chat.jsonl";
  write(p, json({{"messages", json::array({{{"role", "system"}, {"content", "S"}},
                                           {{"role", "user"}, {"content", "2+2?"}},
                                           {{"role", "assistant"}, {"content", "4"}}})}})
                   .dump() +
               "\n");
  const Dataset ds = load_jsonl(p.string(), f.tok.vocab_size(), f.opts(false));
  ASSERT_EQ(ds.records.size(), 1u);
  const Record& r = ds.records[0];
  EXPECT_EQ(f.tok.decode(r.ids),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n");
  std::vector<int32_t> trained;
  for (size_t k = 0; k < r.ids.size(); ++k)
    if (r.labels[k] != kIgnoreIndex) trained.push_back(r.labels[k]);
  // Qwen2.5's own template: the header's newline is trained, as TRL's training template does.
  EXPECT_EQ(f.tok.decode(trained), "\n4<|im_end|>\n");
  // --train-on all
  LoadOptions all = f.opts(false);
  all.train_on_all = true;
  const Dataset ds2 = load_jsonl(p.string(), f.tok.vocab_size(), all);
  EXPECT_EQ(ds2.records[0].labels, ds2.records[0].ids);
}

TEST(DatasetChat, ChatErrorsNameFileAndLine) {
  test::TempDir d;
  Fixture f;
  const fs::path p = d.path / "bad.jsonl";
  auto error_of = [&](const std::string& line, LoadOptions o) {
    write(p, "{\"text\": \"ok\"}\n" + line + "\n");
    try {
      load_jsonl(p.string(), f.tok.vocab_size(), o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string at = p.string() + ":2: ";
  EXPECT_EQ(error_of("{\"messages\": \"hi\"}", f.opts(false)),
            at + "'messages' must be an array of {\"role\", \"content\"} objects");
  EXPECT_EQ(error_of("{\"messages\": []}", f.opts(false)), at + "'messages' must be a non-empty array");
  EXPECT_EQ(error_of("{\"messages\": [{\"role\": \"user\"}]}", f.opts(false)),
            at + "'messages'[0] needs a string 'content'");
  LoadOptions none = f.opts(false);
  none.chat_template = []() -> const ChatTemplate* { return nullptr; };
  EXPECT_NE(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", none).find(at + "chat records need"),
            std::string::npos);
  // A template that raises: the record's file and line, the template's line and message.
  f.chat = ChatTemplate::parse("{{ raise_exception('roles must alternate') }}", "tc.json");
  EXPECT_NE(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", f.opts(false))
                .find(at + "chat template tc.json: line 1: roles must alternate"),
            std::string::npos);
  EXPECT_EQ(error_of("{\"other\": 1}", f.opts(false)),
            at + "needs 'input_ids', 'text', 'prompt' and 'completion', or 'messages'");
}

TEST(DatasetChat, ParallelEqualsSerial) {
  test::TempDir d;
  Fixture f;
  const fs::path p = d.path / "mixed.jsonl";
  write(p, mixed_data(400));
  LoadOptions one = f.opts(false);
  one.threads = 1;
  LoadOptions many = f.opts(false);
  many.threads = 4;
  const Dataset a = load_jsonl(p.string(), f.tok.vocab_size(), one);
  const Dataset b = load_jsonl(p.string(), f.tok.vocab_size(), many);
  expect_same(a, b);
  // And as one record at a time with encode().
  ASSERT_EQ(a.records.size(), 400u);
  std::ifstream in(p);
  std::string line;
  for (size_t k = 0; std::getline(in, line); ++k) {
    const json j = json::parse(line);
    if (j.contains("text")) {
      EXPECT_EQ(a.records[k].ids, f.tok.encode(j["text"].get<std::string>(), true)) << k;
    } else if (j.contains("prompt")) {
      std::vector<int32_t> ids = f.tok.encode(j["prompt"].get<std::string>(), true);
      const size_t np = ids.size();
      const std::vector<int32_t> c = f.tok.encode(j["completion"].get<std::string>(), false);
      ids.insert(ids.end(), c.begin(), c.end());
      EXPECT_EQ(a.records[k].ids, ids) << k;
      for (size_t t = 0; t < np; ++t) EXPECT_EQ(a.records[k].labels[t], kIgnoreIndex);
    } else if (j.contains("messages")) {
      const ChatRendering r = render_chat(f.chat, j["messages"], kDatasetNow, "x");
      EXPECT_EQ(a.records[k].ids, f.tok.encode(r.text, false)) << k;
    }
  }
}

// stream_jsonl (what tokenize --jsonl and load_jsonl run on): chunks in file order whatever the
// threads, the records load_jsonl gives, chats with their rendered text; the first bad line in file
// order (in the third chunk, a worse one after it) is thrown after every record before it was handed on.
TEST(DatasetChat, StreamKeepsFileOrderAndStopsAtTheFirstError) {
  test::TempDir d;
  Fixture f;
  const fs::path p = d.path / "mixed.jsonl";
  const int n = 2600;  // three chunks of at most 1,024 lines
  write(p, mixed_data(n));
  const Dataset want = load_jsonl(p.string(), f.tok.vocab_size(), f.opts(false));
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    LoadOptions o = f.opts(false);
    o.threads = threads;
    o.keep_chat_text = true;
    Dataset got;
    size_t chunks = 0, formatted = 0;
    std::vector<std::string> texts;
    stream_jsonl(
        p.string(), f.tok.vocab_size(), o, [&](LoadedRecord& r) { r.out = std::to_string(r.line); },
        [&](std::vector<LoadedRecord>& chunk) {
          ++chunks;
          for (LoadedRecord& r : chunk) {
            EXPECT_EQ(r.line, got.records.size() + 1);
            formatted += r.out == std::to_string(r.line);
            if (r.kind == LoadedRecord::Chat) texts.push_back(r.text);
            got.records.push_back(std::move(r.record));
          }
        });
    EXPECT_EQ(chunks, 3u);
    EXPECT_EQ(formatted, size_t(n));
    expect_same(got, want);
    ASSERT_EQ(texts.size(), size_t(n / 4));
    const json messages = json::parse(mixed_data(3).substr(mixed_data(2).size()))["messages"];
    EXPECT_EQ(texts[0], render_chat(f.chat, messages, kDatasetNow, "x").text);
  }
  std::string lines = mixed_data(2100);
  lines += "{\"text\": 5}\n{\"input_ids\": [1, 2, 3]}\nnot json\n";
  write(p, lines);
  size_t handed = 0;
  try {
    LoadOptions o = f.opts(false);
    o.threads = 3;
    stream_jsonl(p.string(), f.tok.vocab_size(), o, nullptr,
                 [&](std::vector<LoadedRecord>& chunk) { handed += chunk.size(); });
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), p.string() + ":2101: 'text' must be a string");
  }
  EXPECT_EQ(handed, 2100u);
}

// The sink runs beside the next chunk's encoding: an error it throws (tokenize's failed write) is
// the one stream_jsonl throws, and no chunk after it is handed on.
TEST(DatasetChat, StreamStopsAtTheSinksError) {
  test::TempDir d;
  Fixture f;
  const fs::path p = d.path / "mixed.jsonl";
  write(p, mixed_data(3500));  // four chunks
  for (int threads : {1, 3}) {
    LoadOptions o = f.opts(false);
    o.threads = threads;
    size_t calls = 0, first_line = 0;
    try {
      stream_jsonl(p.string(), f.tok.vocab_size(), o, nullptr, [&](std::vector<LoadedRecord>& chunk) {
        ++calls;
        first_line = chunk.front().line;
        if (calls == 2) input_error("out", "cannot write the output");
      });
      ADD_FAILURE() << "no error";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), "out: cannot write the output");
    }
    EXPECT_EQ(calls, 2u);
    EXPECT_EQ(first_line, 1025u);
  }
}

TEST(DatasetChat, CacheHitMissAndCorruption) {
  test::TempDir d;
  Fixture f;
  const fs::path p = d.path / "data.jsonl";
  write(p, mixed_data(60));
  const int64_t vocab = f.tok.vocab_size();
  const Dataset fresh = load_jsonl(p.string(), vocab, f.opts(false));
  EXPECT_EQ(dataset_cache_path(p.string(), vocab, f.opts(false)), "");
  const std::string cache = dataset_cache_path(p.string(), vocab, f.opts());
  ASSERT_FALSE(cache.empty());
  EXPECT_EQ(cache.rfind(p.string() + ".sf-cache-", 0), 0u) << cache;
  EXPECT_FALSE(fs::exists(cache));  // --no-data-cache wrote nothing

  // Miss: tokenized and written; hit: read back without parsing the data.
  expect_same(load_jsonl(p.string(), vocab, f.opts()), fresh);
  ASSERT_TRUE(fs::exists(cache));
  {
    // A change with the same size and mtime inside the hashed first MiB is a miss (the cache is
    // not used for the changed data, which fails to parse here).
    const auto mtime = fs::last_write_time(p);
    std::string s = mixed_data(60);
    std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(std::streamoff(s.size() / 2));
    io.put('\x01');
    io.close();
    fs::last_write_time(p, mtime);
    EXPECT_THROW(load_jsonl(p.string(), vocab, f.opts()), InputError);
    write(p, s);
  }
  expect_same(load_jsonl(p.string(), vocab, f.opts()), fresh);

  // Another tokenizer, template or --train-on: another cache file.
  LoadOptions all = f.opts();
  all.train_on_all = true;
  EXPECT_NE(dataset_cache_path(p.string(), vocab, all), dataset_cache_path(p.string(), vocab, f.opts()));

  // A corrupt cache (a flipped byte, cut short, garbage) is ignored and rebuilt.
  const std::string good = [&] {
    std::ifstream in(dataset_cache_path(p.string(), vocab, f.opts()), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();
  const std::string c = dataset_cache_path(p.string(), vocab, f.opts());
  for (int variant = 0; variant < 4; ++variant) {
    std::string bad = good;
    if (variant == 0) bad[bad.size() / 2] ^= 0x40;
    if (variant == 1) bad.resize(bad.size() - 5);
    if (variant == 2) bad = "not a cache";
    if (variant == 3) bad[40] ^= 1;  // a record length
    write(c, bad);
    expect_same(load_jsonl(p.string(), vocab, f.opts()), fresh);
    std::ifstream in(c, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(ss.str(), good) << variant;  // rewritten
  }
  // The same cache read for a smaller vocabulary would hold ids out of range: another key.
  EXPECT_NE(dataset_cache_path(p.string(), vocab - 1, f.opts()), c);
}

TEST(DatasetChat, AnUnusableTemplateOnlyMattersToChatRecords) {
  test::TempDir d;
  Fixture f;
  LoadOptions o = f.opts();
  o.chat_template = []() -> const ChatTemplate* { sf::input_error("m/chat_template.jinja", "unsupported"); };
  const fs::path p = d.path / "text.jsonl";
  write(p, "{\"text\": \"plain text\"}\n");
  EXPECT_EQ(load_jsonl(p.string(), f.tok.vocab_size(), o).records.size(), 1u);
  write(p, "{\"text\": \"plain text\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n");
  try {
    load_jsonl(p.string(), f.tok.vocab_size(), o);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "m/chat_template.jinja: unsupported");
  }
}

TEST(DatasetChat, TokenIdFilesAreNotCached) {
  test::TempDir d;
  Fixture f;
  const fs::path p = d.path / "ids.jsonl";
  write(p, "{\"input_ids\": [1, 2, 3]}\n");
  load_jsonl(p.string(), f.tok.vocab_size(), f.opts());
  for (const auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find(".sf-cache-"), std::string::npos) << e.path();
}

// Every record kind (text, prompt / completion, chat with a system turn, chat with tool calls and
// a tool turn, token ids with labels) with each member at every depth set to each of a set of
// hostile values or removed, the chat ones rendered by five real templates: each record is refused
// by an input error naming the file and its line, or loaded with ids in the vocabulary and labels
// that are ids or -100, as many as the ids.
TEST(DatasetChat, HostileValuesInEveryRecordKindGiveOnlyInputErrors) {
  test::TempDir d;
  Fixture f;
  const std::string dir = std::string(SF_SOURCE_DIR) + "/tests/data/chat_templates/";
  auto tmpl = [&](const std::string& name, const std::string& bos, const std::string& eos) {
    std::ifstream in(dir + name);
    std::stringstream ss;
    ss << in.rdbuf();
    jinja::Dict special;
    if (!bos.empty()) special.emplace_back("bos_token", jinja::Value::str(bos));
    special.emplace_back("eos_token", jinja::Value::str(eos));
    return ChatTemplate::parse(ss.str(), dir + name, special);
  };
  const std::vector<ChatTemplate> templates = {
      tmpl("qwen2.5.jinja", "", "<|im_end|>"), tmpl("qwen3.jinja", "", "<|im_end|>"),
      tmpl("llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>"), tmpl("gemma3.jinja", "<bos>", "<eos>"),
      tmpl("mistral-v0.3.jinja", "<s>", "</s>")};
  const std::vector<json> records = {
      {{"text", "hello w\xC3\xB6rld"}},
      {{"prompt", "Q: "}, {"completion", " A"}},
      {{"messages", json::array({{{"role", "system"}, {"content", "S"}},
                                 {{"role", "user"}, {"content", "hi"}},
                                 {{"role", "assistant"}, {"content", "yo"}}})}},
      {{"messages",
        json::array({{{"role", "user"}, {"content", "x"}},
                     {{"role", "assistant"},
                      {"content", "y"},
                      {"tool_calls", json::array({{{"type", "function"},
                                                   {"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}}})}},
                     {{"role", "tool"}, {"content", "r"}},
                     {{"role", "assistant"}, {"content", "z"}}})}},
      {{"input_ids", {1, 2, 3}}, {"labels", {1, -100, 3}}}};
  const std::vector<json> hostile = {0,
                                     -1,
                                     int64_t(1) << 31,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<uint64_t>::max(),
                                     1e300,
                                     0.5,
                                     "",
                                     std::string(3000, 'a'),
                                     "\xF0\x9F\x98\x80<|im_end|>{{ x }}",
                                     "assistant",
                                     "tool",
                                     nullptr,
                                     true,
                                     json::array(),
                                     json::object(),
                                     json::array({-5}),
                                     json::array({1, 2, 3, 4}),
                                     json{{"role", "user"}, {"content", "q"}}};
  const int64_t V = f.tok.vocab_size();
  const fs::path p = d.path / "h.jsonl";
  int tried = 0, loaded = 0;
  for (size_t k = 0; k < records.size(); ++k) {
    const json& base = records[k];
    const bool chat = base.contains("messages");
    for (size_t t = 0; t < (chat ? templates.size() : 1); ++t) {
      f.chat = templates[t];
      test::for_each_hostile_variant(base, hostile, [&](const json& r, const std::string& what) {
        ++tried;
        write(p, "{\"text\": \"ok\"}\n" + r.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
        try {
          const Dataset ds = load_jsonl(p.string(), V, f.opts(false));
          ASSERT_EQ(ds.records.size(), 2u) << what;
          const Record& rec = ds.records[1];
          ASSERT_EQ(rec.ids.size(), rec.labels.size()) << what;
          for (size_t i = 0; i < rec.ids.size(); ++i) {
            ASSERT_TRUE(rec.ids[i] >= 0 && rec.ids[i] < V) << what;
            ASSERT_TRUE(rec.labels[i] == kIgnoreIndex || (rec.labels[i] >= 0 && rec.labels[i] < V)) << what;
          }
          ++loaded;
        } catch (const InputError& e) {
          EXPECT_NE(std::string(e.what()).find(p.string() + ":2"), std::string::npos)
              << "record " << k << " template " << t << " " << what << ": " << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << "record " << k << " template " << t << " " << what << ": not an input error: " << e.what();
        }
      });
    }
  }
  EXPECT_GT(tried, 2000);
  EXPECT_GT(loaded, 200);
  std::printf("hostile record values: %d tried, %d loaded\n", tried, loaded);
}

}  // namespace
