#include "data/chat.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer.h"
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

// Steps of all the renderings of one record (finding the assistant turns renders the conversation
// once per assistant message): a long conversation of tiny messages cannot make that quadratic
// work unbounded.
constexpr uint64_t kRecordSteps = 50'000'000;

jinja::Rendered render_messages(const ChatTemplate& t, const jinja::Value& all, size_t n, bool gen_prompt,
                                std::time_t now, const std::string& where, uint64_t* budget = nullptr) {
  jinja::Dict vars = t.special;
  jinja::List msgs(all.list->begin(), all.list->begin() + std::ptrdiff_t(n));
  vars.emplace_back("messages", jinja::Value::new_list(std::move(msgs)));
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(gen_prompt));
  vars.emplace_back("tools", jinja::Value::none());
  vars.emplace_back("documents", jinja::Value::none());
  try {
    jinja::RenderLimits lim;
    if (budget) {
      if (*budget == 0)
        input_error(where, "chat template " + t.file + ": the record takes more than " + std::to_string(kRecordSteps) +
                               " steps to render");
      lim.max_steps = std::min<uint64_t>(lim.max_steps, *budget);
    }
    jinja::Rendered r = t.tmpl.render(vars, now, lim);
    if (budget) *budget -= std::min(*budget, r.steps);
    return r;
  } catch (const jinja::RenderError& e) {
    if (budget && *budget < jinja::RenderLimits{}.max_steps &&
        std::string(e.what()).find(" steps") != std::string::npos)
      input_error(where, "chat template " + t.file + ": the record takes more than " + std::to_string(kRecordSteps) +
                             " steps to render (" + std::to_string(all.list->size()) + " messages)");
    input_error(where, "chat template " + t.file + ": " + e.what());
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

ChatRendering render_chat(const ChatTemplate& t, const nlohmann::json& messages, std::time_t now,
                          const std::string& where) {
  if (!messages.is_array() || messages.empty()) input_error(where, "'messages' must be a non-empty array");
  for (size_t k = 0; k < messages.size(); ++k) {
    const auto& m = messages[k];
    const std::string at = "'messages'[" + std::to_string(k) + "]";
    if (!m.is_object()) input_error(where, at + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) input_error(where, at + " needs a string 'role'");
    if (!m.contains("content") || !(m["content"].is_string() || m["content"].is_null()))
      input_error(where, at + " needs a string 'content'");
  }
  const jinja::Value all = jinja::Value::from_json(messages);
  const size_t n = messages.size();
  uint64_t budget = kRecordSteps;
  ChatRendering out;
  jinja::Rendered full = render_messages(t, all, n, false, now, where, &budget);
  out.text = std::move(full.text);
  if (t.tmpl.has_generation()) {
    for (const auto& g : full.generation)
      if (g.second > g.first) out.assistant.push_back(g);
    return out;
  }
  auto with_marker = [&](size_t i, bool before_content) {
    jinja::Value copy = jinja::Value::from_json(messages);
    jinja::Value& c = *(*copy.list)[i].find("content");
    if (c.kind != jinja::Value::Str) c = jinja::Value::str("");
    c.s = before_content ? "\x02" + c.s : c.s + "\x02";
    return render_messages(t, copy, n, false, now, where, &budget).text;
  };
  auto common_prefix = [](const std::string& a, const std::string& b) {
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    return k;
  };
  for (size_t i = 0; i < n; ++i) {
    if (messages[i]["role"] != "assistant") continue;
    const std::string before = render_messages(t, all, i, true, now, where, &budget).text;
    size_t s, e;
    if (starts_with(out.text, before)) {
      const std::string upto = render_messages(t, all, i + 1, false, now, where, &budget).text;
      s = before.size();
      if (starts_with(out.text, upto) && upto.size() >= s) {
        e = upto.size();
      } else {
        const std::string turn = upto.size() > s ? upto.substr(s) : std::string();
        const std::string rest = out.text.substr(s);
        size_t len = suffix_prefix_overlap(turn, rest);
        if (len == 0) len = common_prefix(turn, rest);
        e = s + len;
      }
    } else {
      // The conversation before this turn renders differently on its own (Mistral v0.3 puts the
      // system message into the last user message): the turn is the message's content, found by
      // rendering it with a marker before and after it, and the end-of-sequence token after it.
      s = common_prefix(out.text, with_marker(i, true));
      e = common_prefix(out.text, with_marker(i, false));
      if (e < s) e = s;
      const jinja::Value* eos = nullptr;
      for (const auto& [k, v] : t.special)
        if (k == "eos_token") eos = &v;
      if (eos && eos->kind == jinja::Value::Str && !eos->s.empty() && out.text.compare(e, eos->s.size(), eos->s) == 0)
        e += eos->s.size();
    }
    if (e > s) out.assistant.emplace_back(s, e);
  }
  return out;
}

std::vector<int32_t> assistant_labels(const Tokenizer& tok, const ChatRendering& r, const std::vector<int32_t>& ids) {
  std::vector<int32_t> labels(ids.size(), kIgnoreIndex);
  if (r.assistant.empty() || ids.empty()) return labels;
  // Byte offsets of the tokens: exact when the tokens' bytes spell the text (byte-level BPE
  // without a normalizer that changed it); otherwise from the token counts of prefixes.
  // A token's bytes depend on its id alone: each distinct id is decoded once.
  std::vector<size_t> start(ids.size() + 1, 0);
  std::unordered_map<int32_t, size_t> bytes_of;
  size_t pos = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    start[k] = pos;
    auto [it, fresh] = bytes_of.try_emplace(ids[k], 0);
    if (fresh) it->second = tok.decode({ids[k]}).size();
    pos += it->second;
  }
  start[ids.size()] = pos;
  const bool exact = pos == r.text.size();
  auto token_at = [&](size_t byte) -> size_t {  // the token holding `byte`
    if (exact) {
      const auto it = std::upper_bound(start.begin(), start.end() - 1, byte);
      return size_t(it - start.begin()) - 1;
    }
    const size_t n = tok.encode(r.text.substr(0, byte + 1), false).size();
    return n == 0 ? 0 : std::min(n - 1, ids.size() - 1);
  };
  for (const auto& [s, e] : r.assistant) {
    if (s >= r.text.size()) break;
    const size_t a = token_at(s);
    const size_t b = token_at(std::min(e, r.text.size()) - 1);
    for (size_t k = a; k <= b && k < ids.size(); ++k) labels[k] = ids[k];
  }
  return labels;
}

}  // namespace sf
