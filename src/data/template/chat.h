// Chat records: {"messages": [{"role": ..., "content": ...}, ...]} rendered with the model's own
// chat template (tokenizer_config.json "chat_template", or chat_template.jinja) as transformers'
// apply_chat_template renders it, tokenized without added special tokens (the template writes
// them), with labels only on the assistant turns (or on every token).
//
// The messages keep the key order of the record's text and integers of any length (Python's
// json.loads), so tojson prints tool calls as transformers does.
//
// Assistant turns are located by rendering. A template with {% generation %} blocks gives them
// directly (as return_assistant_tokens_mask). Otherwise a turn is the text the template writes for
// that assistant message after its header: its content and what follows it up to the next message
// (the end-of-turn marker), plus what the template writes between the header and the content
// (Qwen3's <think> block). It is found by diffing renderings: for assistant message i, the turn starts
// where render(messages[:i], add_generation_prompt=True) ends when the full rendering starts with
// that, and ends where render(messages[:i+1]) ends when the full rendering starts with that too (or at
// the longest end of that rendering's last turn the full text continues with: Qwen3 writes <think> only
// in the last turn). When a prefix renders differently alone or not at all (an assistant message
// first; Mistral v0.3 moves the system message), the content is located in the full text by a marker
// (a byte found in neither) and extended by what render(messages[:i+1]) writes before it after the
// header and after it. Tokens are labelled as transformers does: every token from the one holding a
// turn's first character to the one holding its last, by the tokenizer's character offsets.
#pragma once
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset/dataset.h"
#include "data/template/jinja_eval.h"

namespace sf {

class Tokenizer;

struct ChatTemplate {
  std::string file;  // where it came from (errors)
  jinja::Template tmpl;
  jinja::Dict special;     // bos_token, eos_token, unk_token, pad_token (those the config gives)
  uint64_t hash = 0;       // of the source and the special tokens (cache keys)
  bool uses_date = false;  // calls strftime_now (renderings change with the date)
  // What a turn holds of its header. Where TRL ships a generation-tagged training template for
  // this exact template (identified by its text), that template's choice: Qwen2.5's trains the
  // newline after "<|im_start|>assistant", DeepSeek-V3's the whole header ("<｜Assistant｜>"; not
  // the "<｜tool▁outputs▁end｜>" TRL's also puts in a turn after tool results: the model's template
  // writes it with the conversation before). Elsewhere none of it (docs/DECISIONS.md, "Assistant turns").
  enum class TurnStart { AfterHeader, HeaderNewline, WithHeader };
  TurnStart turn_start = TurnStart::AfterHeader;
  jinja::RenderLimits limits;            // of each rendering
  uint64_t record_steps = 50'000'000;  // of all the renderings of one record (finding the turns
                                       // renders the conversation once per assistant message)

  // The model directory's template: chat_template.jinja, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {"name", "template"}: the one named "default").
  // nullopt when the directory has none. A template outside the interpreter's subset is an
  // InputError naming the file, the line and the construct.
  static std::optional<ChatTemplate> load(const std::string& model_dir);
  // From source text; `file` names it in errors.
  static ChatTemplate parse(const std::string& source, const std::string& file, jinja::Dict special = {});
};

struct ChatRendering {
  std::string text;
  std::vector<std::pair<size_t, size_t>> assistant;  // byte ranges of the assistant turns
};

// Renders `messages` (a list of message objects; checked: InputError at `where`) with
// add_generation_prompt false and finds the assistant turns. `now` is what strftime_now formats.
ChatRendering render_chat(const ChatTemplate& t, const jinja::Value& messages, std::time_t now,
                          const std::string& where);
// The same from a parsed JSON array. nlohmann sorts object keys and reads long integers as floats:
// records should go through chat_messages() instead.
ChatRendering render_chat(const ChatTemplate& t, const nlohmann::json& messages, std::time_t now,
                          const std::string& where);
// The "messages" of a JSON record's text, objects in the text's order, integers exact. InputError at
// `where` when malformed or absent.
jinja::Value chat_messages(const std::string& record, const std::string& where);

// The tokens of r.text (without added special tokens: the template writes them), encoded once with
// their offsets, and their labels: ids inside an assistant turn, -100 elsewhere.
Record chat_tokens(const Tokenizer& tok, const ChatRendering& r);
// chat_tokens(tok, r).labels, for `ids` that must be the tokens of r.text (logic_error otherwise).
std::vector<int32_t> assistant_labels(const Tokenizer& tok, const ChatRendering& r, const std::vector<int32_t>& ids);

}  // namespace sf
