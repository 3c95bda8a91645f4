// `slideformer tokenize`: token ids of a text, or of each record of a JSONL file, with a model's
// tokenizer.json (one JSON line each).
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "core/error.h"
#include "core/units.h"
#include "data/template/chat.h"
#include "data/dataset/dataset.h"
#include "data/tokenizer/tokenizer.h"

namespace sf {

namespace {

struct TokenizeOptions {
  std::string model, file, text, jsonl;
  std::string max_record_bytes;  // "" = the default, as for train
  bool no_special = false;
};

// One output line of a record, built on the loader's threads: {"ids": [...]} for a text, with
// "labels" for prompt/completion and token records, and "text" (the rendering) for a chat; the same
// bytes print_json writes, without building a JSON tree.
void append_ids(std::string& out, const char* key, const std::vector<int32_t>& v) {
  out += '"';
  out += key;
  out += "\":[";
  char buf[16];
  for (size_t k = 0; k < v.size(); ++k) {
    if (k) out += ',';
    out.append(buf, size_t(std::to_chars(buf, buf + sizeof buf, v[k]).ptr - buf));
  }
  out += ']';
}

void format_record(LoadedRecord& r) {
  std::string& out = r.out;
  out.reserve(r.record.ids.size() * 14 + r.text.size() + 64);
  out += '{';
  append_ids(out, "ids", r.record.ids);
  if (r.kind != LoadedRecord::Text) {
    out += ',';
    append_ids(out, "labels", r.record.labels);
  }
  if (r.kind == LoadedRecord::Chat) {
    out += ",\"text\":";
    // Replacement, not an exception, for text that is not UTF-8 (as print_json).
    out += nlohmann::json(r.text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  out += "}\n";
  r.record = {};
  std::string().swap(r.text);
}

// tokenize --jsonl: the records through the data loader's stream (data/dataset/dataset.h: read a
// chunk at a time, parsed, rendered, encoded and formatted on every core), written in file order.
// The first error in file order is thrown after the records before it are written.
void tokenize_jsonl(const Tokenizer& tok, const TokenizeOptions& o) {
  // Chat records use the chat template of the model directory (or of the tokenizer file's).
  const std::string dir = o.file.empty() ? o.model : std::filesystem::path(o.file).parent_path().string();
  std::optional<std::optional<ChatTemplate>> chat;
  LoadOptions lo;
  lo.tokenizer = [&]() -> const Tokenizer& { return tok; };
  lo.chat_template = [&]() -> const ChatTemplate* {
    if (!chat) chat = ChatTemplate::load(dir);
    return *chat ? &**chat : nullptr;
  };
  lo.cache = false;
  lo.add_special = !o.no_special;
  lo.keep_chat_text = true;
  // Whole chunks go out at once: a 1 MiB buffer instead of stdio's 4 KiB (a write call each).
  std::setvbuf(stdout, nullptr, _IOFBF, size_t(1) << 20);
  stream_jsonl(o.jsonl, tok.vocab_size(), lo, format_record, [](std::vector<LoadedRecord>& chunk) {
    for (const LoadedRecord& r : chunk)
      if (std::fwrite(r.out.data(), 1, r.out.size(), stdout) != r.out.size())
        input_error("tokenize", std::string("cannot write the output: ") + std::strerror(errno));
    if (std::fflush(stdout) != 0)
      input_error("tokenize", std::string("cannot write the output: ") + std::strerror(errno));
  });
}

int run_tokenize(const TokenizeOptions& o) {
  if (o.model.empty() == o.file.empty()) input_error("tokenize", "give one of --model DIR or --tokenizer FILE");
  if (o.text.empty() == o.jsonl.empty()) input_error("tokenize", "give one of --text or --jsonl");
  const Tokenizer tok =
      Tokenizer::load(o.file.empty() ? (std::filesystem::path(o.model) / "tokenizer.json").string() : o.file);
  if (!o.text.empty()) {
    print_json({{"ids", tok.encode(o.text, !o.no_special)}});
    return 0;
  }
  if (!o.max_record_bytes.empty()) set_max_record_bytes(parse_size(o.max_record_bytes, "--max-record-bytes"));
  tokenize_jsonl(tok, o);
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* c = app.add_subcommand("tokenize", "token ids of text with a model's tokenizer.json (one JSON line each)");
  c->add_option("--model", o->model, "Hugging Face model directory (its tokenizer.json)");
  c->add_option("--tokenizer", o->file, "or a tokenizer.json");
  c->add_option("--text", o->text, "the text");
  c->add_option("--jsonl", o->jsonl, "or a JSONL file ('-': stdin) of {\"text\": ...} or {\"messages\": [...]} lines");
  c->add_flag("--no-special", o->no_special, "without the post-processor's tokens (BOS)");
  c->add_option("--max-record-bytes", o->max_record_bytes,
                "longest JSONL line accepted, e.g. 256MiB (default 64MiB, as for train)");
  return {c, [o] { return run_tokenize(*o); }};
}

}  // namespace sf
