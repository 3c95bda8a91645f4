#include "data/template/chat.h"

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <algorithm>
#include <stdexcept>

#include "core/error.h"
#include "data/tokenizer/tokenizer.h"
#include "io/json_file.h"

namespace sf {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxTemplateBytes = size_t(1) << 20;

uint64_t fnv(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return (h ^ 0xff) * 0x100000001b3ull;
}

std::string read_small(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) input_error(path, "cannot read: " + ec.message());
  if (size > kMaxTemplateBytes) input_error(path, "a chat template larger than 1 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error(path, "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

jinja::Rendered render_messages(const ChatTemplate& t, const jinja::Value& all, size_t n, bool gen_prompt,
                                std::time_t now, const std::string& where, uint64_t* budget = nullptr) {
  jinja::Dict vars = t.special;
  jinja::List msgs(all.list->begin(), all.list->begin() + std::ptrdiff_t(n));
  vars.emplace_back("messages", jinja::Value::new_list(std::move(msgs)));
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(gen_prompt));
  vars.emplace_back("tools", jinja::Value::none());
  vars.emplace_back("documents", jinja::Value::none());
  try {
    jinja::RenderLimits lim = t.limits;
    if (budget) {
      if (*budget == 0)
        input_error(where, "chat template " + t.file + ": the record takes more than " + std::to_string(t.record_steps) +
                               " steps to render");
      lim.max_steps = std::min<uint64_t>(lim.max_steps, *budget);
    }
    jinja::Rendered r = t.tmpl.render(vars, now, lim);
    if (budget) *budget -= std::min(*budget, r.steps);
    return r;
  } catch (const jinja::RenderError& e) {
    if (budget && *budget < t.limits.max_steps &&
        std::string(e.what()).find(" steps") != std::string::npos)
      input_error(where, "chat template " + t.file + ": the record takes more than " + std::to_string(t.record_steps) +
                             " steps to render (" + std::to_string(all.list->size()) + " messages)");
    input_error(where, "chat template " + t.file + ": " + e.what());
  }
}

// A rendering used only to locate a turn: nullopt when the template refuses it (a prefix of a
// valid conversation need not be valid: an assistant-first chat's messages[:0]).
std::optional<std::string> try_render(const ChatTemplate& t, const jinja::Value& all, size_t n, bool gen_prompt,
                                      std::time_t now, const std::string& where, uint64_t* budget) {
  try {
    return render_messages(t, all, n, gen_prompt, now, where, budget).text;
  } catch (const InputError& e) {
    if (std::string(e.what()).find(" steps to render") != std::string::npos) throw;
    return std::nullopt;
  }
}

// Length of the longest suffix of `a` that `b` starts with.
size_t suffix_prefix_overlap(const std::string& a, const std::string& b) {
  const size_t m = std::min(a.size(), b.size());
  if (m == 0) return 0;
  // prefix function of b[:m] + '\0' + a[a.size()-m:]
  std::string s = b.substr(0, m);
  s += '\0';
  s.append(a, a.size() - m, m);
  std::vector<size_t> pi(s.size(), 0);
  for (size_t i = 1; i < s.size(); ++i) {
    size_t k = pi[i - 1];
    while (k > 0 && s[i] != s[k]) k = pi[k - 1];
    if (s[i] == s[k]) ++k;
    pi[i] = k;
  }
  return pi.back();
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source, const std::string& file, jinja::Dict special) {
  ChatTemplate t;
  t.file = file;
  try {
    t.tmpl = jinja::Template::parse(source);
  } catch (const jinja::SyntaxError& e) {
    input_error(file, std::string("chat template: ") + e.what() + " (not supported)");
  }
  t.special = std::move(special);
  t.uses_date = source.find("strftime_now") != std::string::npos;
  uint64_t h = fnv(0xcbf29ce484222325ull, source);
  // The models' own templates (tests/data/chat_templates) whose TRL training template trains part
  // of the header: Qwen2.5's and DeepSeek-V3's, by the hash and length of their text.
  if (h == 0xf0d52aebabc74f7eull && source.size() == 2507) t.turn_start = ChatTemplate::TurnStart::HeaderNewline;
  if (h == 0xafa32406984bef2full && source.size() == 2301) t.turn_start = ChatTemplate::TurnStart::WithHeader;
  for (const auto& [k, v] : t.special) h = fnv(fnv(h, k), jinja::to_str(v));
  t.hash = h;
  return t;
}

std::optional<ChatTemplate> ChatTemplate::load(const std::string& model_dir) {
  const std::string cfg_path = (fs::path(model_dir) / "tokenizer_config.json").string();
  const std::string jinja_path = (fs::path(model_dir) / "chat_template.jinja").string();
  nlohmann::json cfg;
  if (fs::exists(cfg_path)) cfg = read_json_file(cfg_path);
  jinja::Dict special;
  if (cfg.is_object()) {
    for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      auto it = cfg.find(name);
      if (it == cfg.end() || it->is_null()) continue;
      if (it->is_string()) {
        special.emplace_back(name, jinja::Value::str(it->get<std::string>()));
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        special.emplace_back(name, jinja::Value::str((*it)["content"].get<std::string>()));
      } else {
        input_error(cfg_path, std::string("$.") + name + ": expected a string or an object with \"content\"");
      }
    }
  }
  if (fs::exists(jinja_path)) return parse(read_small(jinja_path), jinja_path, std::move(special));
  if (!cfg.is_object()) return std::nullopt;
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    bool found = false;
    for (const auto& e : *it) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
          !e["template"].is_string())
        input_error(cfg_path, "$.chat_template: expected a string or a list of {\"name\", \"template\"}");
      if (e["name"] == "default") {
        source = e["template"].get<std::string>();
        found = true;
      }
    }
    if (!found) input_error(cfg_path, "$.chat_template: no template named \"default\"");
  } else {
    input_error(cfg_path, "$.chat_template: expected a string or a list of {\"name\", \"template\"}");
  }
  if (source.size() > kMaxTemplateBytes) input_error(cfg_path, "a chat template larger than 1 MiB");
  return parse(source, cfg_path, std::move(special));
}

namespace {

size_t common_prefix(const std::string& a, const std::string& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  return k;
}
size_t common_suffix(const std::string& a, const std::string& b, size_t limit) {
  size_t k = 0;
  while (k < limit && k < a.size() && k < b.size() && a[a.size() - 1 - k] == b[b.size() - 1 - k]) ++k;
  return k;
}

// A byte that is neither in the text nor in the messages: a marker for a message's content.
std::string marker_for(const std::string& text, const std::string& content) {
  for (const char* m : {"\x02", "\x03", "\x1e", "\x1f", "\x01", "\x04", "\x05", "\x06", "\x0e", "\x0f"})
    if (text.find(m) == std::string::npos && content.find(m) == std::string::npos) return m;
  return "\xEE\x80\x80";  // U+E000, private use (a template would have to contain every control byte)
}

// Where message i's content lies in render(messages[:n]): the rendering is diffed with one whose
// content is a marker absent from both. nullopt when the content does not show (the template does
// not print it, or prints it only through a transformation the marker does not survive).
std::optional<std::pair<size_t, size_t>> content_span(const ChatTemplate& t, const jinja::Value& all, size_t i,
                                                      size_t n, const std::string& text, std::time_t now,
                                                      const std::string& where, uint64_t* budget) {
  jinja::Value copy = jinja::Value::new_list(*all.list);
  jinja::Value msg = (*copy.list)[i];
  jinja::Value fresh = jinja::Value::new_dict(*msg.dict);  // messages are shared: copy the one changed
  const jinja::Value* c = fresh.find("content");
  const std::string content = c && c->kind == jinja::Value::Str ? c->s : std::string();
  const std::string mark = marker_for(text, content);
  fresh.set_item("content", jinja::Value::str(mark));
  (*copy.list)[i] = fresh;
  const std::optional<std::string> marked = try_render(t, copy, n, false, now, where, budget);
  if (!marked) return std::nullopt;
  const size_t at = marked->find(mark);
  if (at == std::string::npos || marked->find(mark, at + 1) != std::string::npos) return std::nullopt;
  const size_t s = common_prefix(text, *marked);
  if (s != at) return std::nullopt;
  const size_t tail = common_suffix(text, *marked, std::min(text.size() - s, marked->size() - at - mark.size()));
  if (marked->size() - tail != at + mark.size()) return std::nullopt;
  return std::make_pair(s, text.size() - tail);
}

}  // namespace

jinja::Value chat_messages(const std::string& record, const std::string& where) {
  jinja::Value r;
  try {
    r = jinja::Value::parse_json(record);
  } catch (const jinja::RenderError& e) {
    input_error(where, e.what());
  }
  const jinja::Value* m = r.find("messages");
  if (!m) input_error(where, "needs 'messages'");
  return *m;
}

ChatRendering render_chat(const ChatTemplate& t, const nlohmann::json& messages, std::time_t now,
                          const std::string& where) {
  // nlohmann's objects are sorted by key: the text keeps the order that tojson prints.
  jinja::Value v;
  try {
    v = jinja::Value::parse_json(messages.dump());
  } catch (const jinja::RenderError& e) {
    input_error(where, e.what());
  }
  return render_chat(t, v, now, where);
}

// The start of turn i (at s, after its header) moved back over the part of the header the
// template's family trains (ChatTemplate::TurnStart).
size_t widen_to_header(const ChatTemplate& t, const jinja::Value& all, size_t i, const std::string& text, size_t s,
                       std::time_t now, const std::string& where, uint64_t* budget) {
  switch (t.turn_start) {
    case ChatTemplate::TurnStart::AfterHeader:
      return s;
    case ChatTemplate::TurnStart::HeaderNewline: {
      static const std::string head = "<|im_start|>assistant\n";
      return s >= head.size() && text.compare(s - head.size(), head.size(), head) == 0 ? s - 1 : s;
    }
    case ChatTemplate::TurnStart::WithHeader: {
      // from where the conversation before the message ends, rendered alone
      const std::optional<std::string> bare = try_render(t, all, i, false, now, where, budget);
      return bare && bare->size() <= s && starts_with(text, *bare) ? bare->size() : s;
    }
  }
  return s;
}

ChatRendering render_chat(const ChatTemplate& t, const jinja::Value& all, std::time_t now, const std::string& where) {
  if (all.kind != jinja::Value::ListK || all.list->empty())
    input_error(where, "'messages' must be a non-empty array");
  const size_t n = all.list->size();
  std::vector<bool> assistant(n, false);
  for (size_t k = 0; k < n; ++k) {
    const jinja::Value& m = (*all.list)[k];
    const std::string at = "'messages'[" + std::to_string(k) + "]";
    if (m.kind != jinja::Value::DictK) input_error(where, at + " must be an object");
    const jinja::Value* role = m.find("role");
    if (!role || role->kind != jinja::Value::Str) input_error(where, at + " needs a string 'role'");
    const jinja::Value* content = m.find("content");
    if (content && content->kind != jinja::Value::Str && content->kind != jinja::Value::None)
      input_error(where, at + " needs a string 'content'");
    if (!content && !m.find("tool_calls")) input_error(where, at + " needs a string 'content'");
    assistant[k] = role->s == "assistant";
  }
  uint64_t budget = t.record_steps;
  ChatRendering out;
  jinja::Rendered full = render_messages(t, all, n, false, now, where, &budget);
  out.text = std::move(full.text);
  const std::string& text = out.text;
  if (t.tmpl.has_generation()) {
    for (const auto& g : full.generation)
      if (g.second > g.first) out.assistant.push_back(g);
    return out;
  }
  // A template that writes the generation prompt whatever add_generation_prompt says (the first
  // Llama 3 template) ends every rendering with it: that trailer is the next turn's header, not
  // part of the turn before it. Recognised as: the empty conversation renders the same either way,
  // not empty, and the full text ends with it.
  std::string trailer;
  {
    const std::optional<std::string> e0 = try_render(t, all, 0, false, now, where, &budget);
    const std::optional<std::string> e1 = try_render(t, all, 0, true, now, where, &budget);
    if (e0 && e1 && *e0 == *e1 && !e0->empty() && text.size() >= e0->size() &&
        text.compare(text.size() - e0->size(), e0->size(), *e0) == 0)
      trailer = *e0;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!assistant[i]) continue;
    // The conversation before the turn with the generation prompt, and up to the turn: where they
    // are prefixes of the full text, the turn is what lies between them.
    const std::optional<std::string> before = try_render(t, all, i, true, now, where, &budget);
    const std::optional<std::string> rendered = try_render(t, all, i + 1, false, now, where, &budget);
    // `upto` without the trailer; `rendered` as the template wrote it (the marker diff needs it)
    std::optional<std::string> upto = rendered;
    if (upto && !trailer.empty() && upto->size() >= trailer.size() &&
        upto->compare(upto->size() - trailer.size(), trailer.size(), trailer) == 0)
      upto->resize(upto->size() - trailer.size());
    size_t s = 0, e = 0;
    if (before && starts_with(text, *before)) {
      s = before->size();
      if (upto && starts_with(text, *upto) && upto->size() >= s) {
        e = upto->size();
      } else if (upto && upto->size() > s && starts_with(*upto, *before)) {
        // Rendered differently when last (Qwen3's <think> block): the longest end of the turn as
        // rendered last that the full text continues with.
        const std::string turn = upto->substr(s);
        const std::string rest = text.substr(s);
        size_t len = suffix_prefix_overlap(turn, rest);
        if (len == 0) len = common_prefix(turn, rest);
        e = s + len;
      } else if (const auto c = content_span(t, all, i, n, text, now, where, &budget)) {
        e = c->second;
      } else {
        continue;
      }
    } else {
      // The conversation before the turn renders differently on its own, or not at all (an
      // assistant message first; Mistral v0.3 moves the system message; Qwen3 drops the <think>
      // of earlier turns): the content is found by a marker, and extended by what the template
      // writes around it when the turn is last (after the header, before the content; after it).
      const auto c = content_span(t, all, i, n, text, now, where, &budget);
      if (!c) continue;
      s = c->first;
      e = c->second;
      if (upto) {
        if (const auto pc = content_span(t, all, i, i + 1, *rendered, now, where, &budget)) {
          size_t h = pc->first;  // where the header ends in `upto`
          const std::optional<std::string> bare = i > 0 ? try_render(t, all, i, false, now, where, &budget)
                                                        : std::optional<std::string>();
          if (before) {
            const size_t hp = bare ? common_prefix(*bare, *before) : 0;
            const std::string header = before->substr(hp);
            const size_t at = header.empty() ? std::string::npos : upto->rfind(header, pc->first);
            if (at != std::string::npos && at + header.size() <= pc->first) h = at + header.size();
          }
          const std::string lead = upto->substr(h, pc->first - h);
          const std::string tail = pc->second < upto->size() ? upto->substr(pc->second) : std::string();
          size_t l = std::min(lead.size(), s);
          while (l > 0 && text.compare(s - l, l, lead, lead.size() - l, l) != 0) --l;
          s -= l;
          e += common_prefix(tail, text.substr(e, tail.size()));
        }
      } else {
        const jinja::Value* eos = nullptr;
        for (const auto& [k, v] : t.special)
          if (k == "eos_token") eos = &v;
        if (eos && eos->kind == jinja::Value::Str && !eos->s.empty() && text.compare(e, eos->s.size(), eos->s) == 0)
          e += eos->s.size();
      }
    }
    if (e > s) out.assistant.emplace_back(widen_to_header(t, all, i, text, s, now, where, &budget), e);
  }
  return out;
}

Record chat_tokens(const Tokenizer& tok, const ChatRendering& r) {
  Record rec;
  if (r.assistant.empty()) {  // nothing to locate: no offsets needed
    rec.ids = tok.encode(r.text, false);
    rec.labels.assign(rec.ids.size(), kIgnoreIndex);
    return rec;
  }
  // As transformers: a turn labels every token from the one holding its first character to the one
  // holding its last, by the tokens' character offsets (one encoding gives ids and offsets).
  std::vector<std::pair<size_t, size_t>> off;
  rec.ids = tok.encode_offsets(r.text, off, false);
  rec.labels.assign(rec.ids.size(), kIgnoreIndex);
  for (const auto& turn : r.assistant) {
    const size_t s = turn.first, e = turn.second;  // (lambdas below capture them: no structured binding)
    if (s >= e || s >= r.text.size()) continue;
    const size_t last = std::min(e, r.text.size()) - 1;
    // The first token ending after s (holding s, or the first after it when s lies in no token),
    // and the last token starting at or before `last`.
    // (Offsets never decrease along the tokens.)
    const size_t a = size_t(std::partition_point(off.begin(), off.end(), [&](const auto& o) { return o.second <= s; }) -
                            off.begin());
    const size_t b = size_t(std::partition_point(off.begin(), off.end(), [&](const auto& o) { return o.first <= last; }) -
                            off.begin());
    for (size_t k = a; k < b; ++k) rec.labels[k] = rec.ids[k];
  }
  return rec;
}

std::vector<int32_t> assistant_labels(const Tokenizer& tok, const ChatRendering& r, const std::vector<int32_t>& ids) {
  Record rec = chat_tokens(tok, r);
  if (rec.ids != ids) throw std::logic_error("assistant_labels: ids are not the encoding of the rendered text");
  return std::move(rec.labels);
}

}  // namespace sf
