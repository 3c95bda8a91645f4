// `slideformer tokenize`: token ids of a text, or of each record of a JSONL file, with a model's
// tokenizer.json (one JSON line each).
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/cli_common.h"
#include "core/error.h"
#include "core/units.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "io/line_reader.h"

namespace sf {

namespace {

struct TokenizeOptions {
  std::string model, file, text, jsonl;
  std::string max_record_bytes;  // "" = the default, as for train
  bool no_special = false;
};

// One JSONL record: a chat (ids, labels -100 outside the assistant turns, and the rendered text) or a text.
void tokenize_record(const Tokenizer& tok, const std::string& dir, std::optional<std::optional<ChatTemplate>>& chat,
                     const nlohmann::json& j, const std::string& where, bool special) {
  if (j.is_object() && j.contains("messages")) {
    if (!chat) chat = ChatTemplate::load(dir);
    if (!*chat) input_error(dir, "no chat template (tokenizer_config.json or chat_template.jinja)");
    const ChatRendering r = render_chat(**chat, j["messages"], std::time(nullptr), where);
    const std::vector<int32_t> ids = tok.encode(r.text, false);
    print_json({{"ids", ids}, {"labels", assistant_labels(tok, r, ids)}, {"text", r.text}});
    return;
  }
  if (!j.contains("text") || !j["text"].is_string()) input_error(where, "no \"text\" or \"messages\"");
  print_json({{"ids", tok.encode(j["text"].get<std::string>(), special)}});
}

int run_tokenize(const TokenizeOptions& o) {
  if (o.model.empty() == o.file.empty()) input_error("tokenize", "give one of --model DIR or --tokenizer FILE");
  if (o.text.empty() == o.jsonl.empty()) input_error("tokenize", "give one of --text or --jsonl");
  const bool special = !o.no_special;
  const Tokenizer tok =
      Tokenizer::load(o.file.empty() ? (std::filesystem::path(o.model) / "tokenizer.json").string() : o.file);
  if (!o.text.empty()) {
    print_json({{"ids", tok.encode(o.text, special)}});
    return 0;
  }
  // The same line limit as training reads data with (--max-record-bytes): a line is never buffered
  // past it, so a file without newlines is refused, not read whole.
  if (!o.max_record_bytes.empty()) set_max_record_bytes(parse_size(o.max_record_bytes, "--max-record-bytes"));
  LineReader in(o.jsonl == "-" ? "/dev/stdin" : o.jsonl, max_record_bytes(), "raise it with --max-record-bytes");
  // Chat records use the chat template of the model directory (or of the tokenizer file's).
  const std::string dir = o.file.empty() ? o.model : std::filesystem::path(o.file).parent_path().string();
  std::optional<std::optional<ChatTemplate>> chat;
  std::string line;
  while (in.next(line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.jsonl + ":" + std::to_string(in.line_number());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      input_error(where, std::string("not JSON: ") + e.what());
    }
    tokenize_record(tok, dir, chat, j, where, special);
  }
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
