// `slideformer tokenize`: token ids of a text, or of each record of a JSONL file, with a model's
// tokenizer.json (one JSON line each).
#include <ctime>
#include <exception>
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
#include "io/json_file.h"
#include "io/line_reader.h"

namespace sf {

namespace {

struct TokenizeOptions {
  std::string model, file, text, jsonl;
  std::string max_record_bytes;  // "" = the default, as for train
  bool no_special = false;
};

// A JSONL record between its parse and its printing: a chat (rendered) or a text, then its ids.
struct TokenizedRecord {
  bool chat = false;
  ChatRendering rendering;  // chat
  std::string text;         // text
  std::vector<int32_t> ids;
};

// tokenize --jsonl: the records a chunk at a time (up to kChunkLines records or kChunkBytes of
// lines), each chunk parsed and rendered in file order, encoded in parallel (encode_batch) and
// printed in file order. The first error in file order (reading, JSON, the record) is thrown after
// the records before it are printed, as a record-by-record loop would.
class JsonlTokenizer {
 public:
  static constexpr size_t kChunkLines = 1024;
  static constexpr size_t kChunkBytes = size_t(4) << 20;

  JsonlTokenizer(const Tokenizer& tok, const TokenizeOptions& o)
      : tok_(tok),
        name_(o.jsonl),
        // Chat records use the chat template of the model directory (or of the tokenizer file's).
        dir_(o.file.empty() ? o.model : std::filesystem::path(o.file).parent_path().string()),
        special_(!o.no_special) {}

  void run() {
    // The same line limit as training reads data with (--max-record-bytes): a line is never
    // buffered past it, so a file without newlines is refused, not read whole.
    LineReader in(name_ == "-" ? "/dev/stdin" : name_, max_record_bytes(), Setting::MaxRecordBytes);
    for (bool more = true; more;) {
      std::vector<TokenizedRecord> chunk;
      std::exception_ptr error;
      more = read_chunk(in, chunk, error);
      encode(chunk);
      for (const TokenizedRecord& r : chunk) print(r);
      if (error) std::rethrow_exception(error);
    }
  }

 private:
  const Tokenizer& tok_;
  const std::string name_, dir_;
  const bool special_;
  std::optional<std::optional<ChatTemplate>> chat_;  // loaded at the first chat record

  // Parses the next records into `chunk`; false at the end of the input or at an error (`error`).
  bool read_chunk(LineReader& in, std::vector<TokenizedRecord>& chunk, std::exception_ptr& error) {
    std::string line;
    for (size_t bytes = 0; chunk.size() < kChunkLines && bytes < kChunkBytes;) {
      try {
        if (!in.next(line)) return false;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        chunk.push_back(parse(line, name_ + ":" + std::to_string(in.line_number())));
      } catch (...) {
        error = std::current_exception();
        return false;
      }
      bytes += line.size();
    }
    return true;
  }

  TokenizedRecord parse(const std::string& line, const std::string& where) {
    check_json_text(where, line.data(), line.data() + line.size());  // NUL, 1e999 (io/json_file.h)
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      input_error(where, std::string("not JSON: ") + e.what());
    }
    TokenizedRecord r;
    if (j.is_object() && j.contains("messages")) {
      if (!chat_) chat_ = ChatTemplate::load(dir_);
      if (!*chat_) input_error(dir_, "no chat template (tokenizer_config.json or chat_template.jinja)");
      r.chat = true;
      // The messages again from the text: in its key order (tojson prints tool calls so), integers exact.
      r.rendering = render_chat(**chat_, chat_messages(line, where), std::time(nullptr), where);
      return r;
    }
    if (!j.contains("text") || !j["text"].is_string()) input_error(where, "no \"text\" or \"messages\"");
    r.text = j["text"].get<std::string>();
    return r;
  }

  // The texts of the chunk encoded in two batches: texts (with the special tokens unless
  // --no-special) and chat renderings (without: the template writes them).
  void encode(std::vector<TokenizedRecord>& chunk) const {
    auto text_of = [](TokenizedRecord& r) -> std::string& { return r.chat ? r.rendering.text : r.text; };
    std::vector<std::string> texts[2];
    for (TokenizedRecord& r : chunk) texts[r.chat].push_back(std::move(text_of(r)));
    std::vector<std::vector<int32_t>> ids[2];
    for (int chat : {0, 1})
      if (!texts[chat].empty()) ids[chat] = tok_.encode_batch(texts[chat], chat == 0 && special_);
    size_t next[2] = {0, 0};
    for (TokenizedRecord& r : chunk) {
      const size_t k = next[r.chat]++;
      r.ids = std::move(ids[r.chat][k]);
      text_of(r) = std::move(texts[r.chat][k]);
    }
  }

  // A chat: its ids, labels (-100 outside the assistant turns) and rendered text; a text: its ids.
  void print(const TokenizedRecord& r) const {
    if (r.chat) {
      print_json({{"ids", r.ids}, {"labels", assistant_labels(tok_, r.rendering, r.ids)}, {"text", r.rendering.text}});
    } else {
      print_json({{"ids", r.ids}});
    }
  }
};

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
  JsonlTokenizer(tok, o).run();
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
