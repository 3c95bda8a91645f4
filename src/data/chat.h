// Chat records: {"messages": [{"role": ..., "content": ...}, ...]} rendered with the model's own
// chat template (tokenizer_config.json "chat_template", or chat_template.jinja) as transformers'
// apply_chat_template renders it, tokenized without added special tokens (the template writes
// them), with labels only on the assistant turns (or on every token).
//
// Assistant turns are located by rendering: a template with {% generation %} blocks gives them
// directly (as return_assistant_tokens_mask). Otherwise, for assistant message i, the turn starts
// where render(messages[:i], add_generation_prompt=True) ends (the full rendering must start with
// it) and ends where render(messages[:i+1]) ends when the full rendering starts with that; when
// it does not (Qwen3 renders a <think> block only in the last turn), the turn is the longest end
// of render(messages[:i+1])'s last turn that the full rendering continues with, and failing that
// the common prefix of both. Tokens are labelled when they overlap a turn, as transformers'
// char_to_token does.
#pragma once
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/jinja_eval.h"

namespace sf {

class Tokenizer;

struct ChatTemplate {
  std::string file;  // where it came from (errors)
  jinja::Template tmpl;
  jinja::Dict special;     // bos_token, eos_token, unk_token, pad_token (those the config gives)
  uint64_t hash = 0;       // of the source and the special tokens (cache keys)
  bool uses_date = false;  // calls strftime_now (renderings change with the date)

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

// Renders `messages` (a JSON array of message objects; checked: InputError at `where`) with
// add_generation_prompt false and finds the assistant turns. `now` is what strftime_now formats.
ChatRendering render_chat(const ChatTemplate& t, const nlohmann::json& messages, std::time_t now,
                          const std::string& where);

// Labels of `ids` (the tokens of r.text): ids inside an assistant turn, -100 elsewhere.
std::vector<int32_t> assistant_labels(const Tokenizer& tok, const ChatRendering& r, const std::vector<int32_t>& ids);

}  // namespace sf
