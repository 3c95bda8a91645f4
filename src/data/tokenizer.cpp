#include "data/tokenizer.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "io/json_file.h"

namespace sf {

namespace {

struct CodeRange {
  uint32_t lo, hi;
};
#include "data/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], uint32_t cp) {
  size_t a = 0, b = N;
  while (a < b) {
    const size_t m = (a + b) / 2;
    if (cp < r[m].lo)
      b = m;
    else if (cp > r[m].hi)
      a = m + 1;
    else
      return true;
  }
  return false;
}
bool is_letter(uint32_t cp) { return in_ranges(kLetterRanges, cp); }
bool is_number(uint32_t cp) { return in_ranges(kNumberRanges, cp); }
// Unicode White_Space (what \s matches in the tokenizers' regex engines).
bool is_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
bool is_other(uint32_t cp) { return !is_space(cp) && !is_letter(cp) && !is_number(cp); }

// Code points of UTF-8 text with the byte offset of each (and one past the end); an invalid byte
// stands for itself as a code point that is neither letter, number nor space.
void decode_utf8(const std::string& s, std::vector<uint32_t>& cps, std::vector<size_t>& off) {
  cps.clear();
  off.clear();
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    bool ok = len > 0 && i + size_t(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
      ok = (d >> 6) == 2;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (!ok) {
      len = 1;
      cp = 0xDC00 + c;  // a lone surrogate: never a letter, number or space
    }
    off.push_back(i);
    cps.push_back(cp);
    i += size_t(len);
  }
  off.push_back(s.size());
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// GPT-2's bytes -> printable code points (and back).
struct ByteMap {
  uint32_t to_cp[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? uint32_t(b) : uint32_t(256 + n++);
      to_byte[to_cp[b]] = uint8_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Contractions: 's 't 're 've 'm 'll 'd; returns the match length in code points (0: none).
size_t contraction(const std::vector<uint32_t>& c, size_t i, bool any_case) {
  if (c[i] != '\'' || i + 1 >= c.size()) return 0;
  auto low = [&](size_t k) -> uint32_t {
    if (k >= c.size()) return 0;
    return any_case && c[k] >= 'A' && c[k] <= 'Z' ? c[k] + 32 : c[k];
  };
  const uint32_t a = low(i + 1), b = low(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End (in code points) of the piece starting at i, for Llama 3's pattern
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (Qwen2's is the same with \p{N} for \p{N}{1,3}).
size_t next_llama3(const std::vector<uint32_t>& c, size_t i, size_t max_digits) {
  const size_t n = c.size();
  if (size_t k = contraction(c, i, true)) return i + k;
  if (i + 1 < n && !is_crlf(c[i]) && !is_letter(c[i]) && !is_number(c[i]) && is_letter(c[i + 1])) {
    size_t j = i + 1;
    while (j < n && is_letter(c[j])) ++j;
    return j;
  }
  if (is_letter(c[i])) {
    size_t j = i;
    while (j < n && is_letter(c[j])) ++j;
    return j;
  }
  if (is_number(c[i])) {
    size_t j = i;
    while (j < n && j - i < max_digits && is_number(c[j])) ++j;
    return j;
  }
  {
    size_t k = i;
    if (c[k] == ' ' && k + 1 < n && is_other(c[k + 1])) ++k;
    if (is_other(c[k])) {
      size_t j = k;
      while (j < n && is_other(c[j])) ++j;
      while (j < n && is_crlf(c[j])) ++j;
      return j;
    }
  }
  // c[i] is whitespace here.
  size_t j = i;
  while (j < n && is_space(c[j])) ++j;
  for (size_t k = j; k > i; --k)
    if (is_crlf(c[k - 1])) return k;  // \s*[\r\n]+ ends at the last line break of the run
  if (j == n || j - i < 2) return j;  // \s+(?!\S) at the end, else \s+
  return j - 1;                       // \s+(?!\S): leave one space to the next piece
}

// GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t next_gpt2(const std::vector<uint32_t>& c, size_t i) {
  const size_t n = c.size();
  if (size_t k = contraction(c, i, false)) return i + k;
  for (auto cls : {is_letter, is_number, is_other}) {
    size_t k = i;
    if (c[k] == ' ' && k + 1 < n && cls(c[k + 1])) ++k;
    if (cls(c[k])) {
      size_t j = k;
      while (j < n && cls(c[j])) ++j;
      return j;
    }
  }
  size_t j = i;
  while (j < n && is_space(c[j])) ++j;
  if (j == n || j - i < 2) return j;
  return j - 1;
}

std::string pattern_of(const nlohmann::json& split) {
  if (!split.contains("pattern")) return "";
  const auto& p = split["pattern"];
  if (p.contains("Regex")) return p["Regex"].get<std::string>();
  if (p.contains("String")) return p["String"].get<std::string>();
  return "";
}

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  auto fail = [&](const std::string& what) { input_error(path, what); };
  Tokenizer t;
  if (!j.contains("model") || !j["model"].is_object()) fail("no \"model\"");
  const auto& m = j["model"];
  if (m.value("type", std::string("BPE")) != "BPE")
    fail("model type " + m.value("type", std::string()) + " is not supported (byte-level BPE only)");
  if (!m.contains("vocab") || !m["vocab"].is_object()) fail("model has no vocab");
  t.ignore_merges_ = m.value("ignore_merges", false);
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) fail("vocab entry '" + it.key() + "' has no integer id");
    t.vocab_[it.key()] = it.value().get<int32_t>();
  }
  if (m.contains("merges")) {
    int rank = 0;
    for (const auto& e : m["merges"]) {
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) fail("merge '" + s + "' is not two symbols");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (e.is_array() && e.size() == 2) {
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        fail("a merge is neither \"a b\" nor [a, b]");
      }
      t.merge_rank_.emplace(std::make_pair(a, b), rank++);
    }
  }
  // Normalizer: none, NFC (input assumed NFC already), or SentencePiece's legacy Prepend("▁") +
  // Replace(" ", "▁").
  const std::string kSpace = "\xE2\x96\x81";  // U+2581
  bool sp_legacy = false;
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const auto& nz = j["normalizer"];
    const std::string type = nz.value("type", std::string());
    if (type == "Sequence" && nz["normalizers"].size() == 2 &&
        nz["normalizers"][0].value("type", std::string()) == "Prepend" &&
        nz["normalizers"][0].value("prepend", std::string()) == kSpace &&
        nz["normalizers"][1].value("type", std::string()) == "Replace" && pattern_of(nz["normalizers"][1]) == " " &&
        nz["normalizers"][1].value("content", std::string()) == kSpace) {
      sp_legacy = true;
    } else if (type != "NFC") {
      fail("normalizer " + type + " is not supported");
    }
  }
  const nlohmann::json pt = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json();
  const std::string pt_type = pt.is_null() ? "" : pt.value("type", std::string());
  if (sp_legacy || pt_type == "Metaspace") {
    // SentencePiece-style BPE over characters.
    t.split_ = Split::SentencePiece;
    if (sp_legacy) {
      if (!pt.is_null()) fail("pre_tokenizer with the Prepend/Replace normalizer is not supported");
      t.sp_prepend_all_ = true;
    } else {
      if (pt.value("replacement", kSpace) != kSpace || pt.value("split", false))
        fail("Metaspace options not supported (replacement U+2581, split false)");
      const std::string scheme = pt.value("prepend_scheme", std::string("always"));
      if (scheme != "first" && scheme != "always") fail("Metaspace prepend_scheme " + scheme + " is not supported");
      t.sp_prepend_all_ = scheme == "always";
    }
    t.byte_fallback_ = m.value("byte_fallback", false);
    t.fuse_unk_ = m.value("fuse_unk", false);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto u = t.vocab_.find(m["unk_token"].get<std::string>());
      if (u != t.vocab_.end()) t.unk_ = u->second;
    }
    if (t.byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        auto it = t.vocab_.find(name);
        if (it == t.vocab_.end()) fail(std::string("byte_fallback without the token ") + name);
        t.byte_token_[b] = it->second;
      }
    }
  } else if (pt.is_null()) {
    fail("no pre_tokenizer (byte-level or SentencePiece-style BPE expected)");
  } else if (pt_type == "ByteLevel") {
    if (!pt.value("use_regex", true) || pt.value("add_prefix_space", false))
      fail("ByteLevel pre_tokenizer options not supported");
    t.split_ = Split::Gpt2;
  } else if (pt_type == "Sequence") {
    const auto& ps = pt["pretokenizers"];
    if (ps.size() != 2 || ps[0].value("type", std::string()) != "Split" ||
        ps[1].value("type", std::string()) != "ByteLevel" || ps[1].value("use_regex", true) ||
        ps[1].value("add_prefix_space", false))
      fail("pre_tokenizer sequence not supported (expected Split + ByteLevel without regex)");
    const std::string pat = pattern_of(ps[0]);
    if (pat == kLlama3Pattern)
      t.split_ = Split::Llama3;
    else if (pat == kQwen2Pattern)
      t.split_ = Split::Qwen2;
    else
      fail("split pattern not supported: " + pat);
    if (ps[0].value("behavior", std::string("Isolated")) != "Isolated" || ps[0].value("invert", false))
      fail("split behavior not supported");
  } else {
    fail("pre_tokenizer " + pt_type + " is not supported");
  }
  // Added tokens, matched literally in the text before anything else (longest first).
  int32_t max_id = -1;
  for (const auto& [tok, id] : t.vocab_) max_id = std::max(max_id, id);
  if (j.contains("added_tokens")) {
    for (const auto& a : j["added_tokens"]) {
      const std::string content = a.value("content", std::string());
      if (content.empty() || !a.contains("id")) fail("an added token has no content or id");
      const int32_t id = a["id"].get<int32_t>();
      t.added_.push_back({content, id});
      max_id = std::max(max_id, id);
    }
  }
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  for (const auto& a : t.added_) t.added_first_[static_cast<unsigned char>(a.first[0])] = true;
  t.id_to_token_.assign(size_t(max_id + 1), std::string());
  for (const auto& [tok, id] : t.vocab_) t.id_to_token_[size_t(id)] = tok;
  // Post-processor: a TemplateProcessing (alone or in a Sequence); ByteLevel ones change nothing here.
  std::function<void(const nlohmann::json&)> post = [&](const nlohmann::json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", std::string());
    if (type == "Sequence") {
      for (const auto& q : p["processors"]) post(q);
    } else if (type == "TemplateProcessing") {
      bool seen_a = false;
      for (const auto& item : p["single"]) {
        if (item.contains("Sequence")) {
          seen_a = true;
        } else if (item.contains("SpecialToken")) {
          const std::string name = item["SpecialToken"]["id"].get<std::string>();
          if (!p["special_tokens"].contains(name)) fail("post_processor: no special token " + name);
          for (const auto& id : p["special_tokens"][name]["ids"])
            (seen_a ? t.suffix_ : t.prefix_).push_back(id.get<int32_t>());
        }
      }
    } else if (type != "ByteLevel") {
      fail("post_processor " + type + " is not supported");
    }
  };
  if (j.contains("post_processor")) post(j["post_processor"]);
  return t;
}

std::vector<std::string> Tokenizer::pre_tokenize(const std::string& text) const {
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  decode_utf8(text, cps, off);
  std::vector<std::string> out;
  for (size_t i = 0; i < cps.size();) {
    const size_t j = split_ == Split::Gpt2 ? next_gpt2(cps, i) : next_llama3(cps, i, split_ == Split::Qwen2 ? 1 : 3);
    out.push_back(text.substr(off[i], off[j] - off[i]));
    i = j;
  }
  return out;
}

void Tokenizer::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  if (auto it = cache_.find(piece); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const ByteMap& bm = byte_map();
  std::vector<std::string> sym;
  std::string word;
  for (unsigned char b : piece) {
    std::string s;
    append_utf8(s, bm.to_cp[b]);
    word += s;
    sym.push_back(std::move(s));
  }
  std::vector<int32_t> ids;
  auto whole = vocab_.find(word);
  if (ignore_merges_ && whole != vocab_.end()) {
    ids.push_back(whole->second);
  } else {
    merge(sym);
    for (const std::string& s : sym) {
      auto v = vocab_.find(s);
      SF_CHECK(v != vocab_.end(), "tokenizer: symbol not in the vocabulary after merges");
      ids.push_back(v->second);
    }
  }
  if (cache_.size() < (1u << 18)) cache_[piece] = ids;
  out.insert(out.end(), ids.begin(), ids.end());
}

// The lowest-ranked adjacent pair first, leftmost among equal ranks (as the tokenizers' BPE
// does), with a heap over a linked list: O(n log n) for long SentencePiece segments.
void Tokenizer::merge(std::vector<std::string>& sym) const {
  const size_t n = sym.size();
  if (n < 2) return;
  std::vector<size_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t k = 0; k < n; ++k) next[k] = k + 1, prev[k] = k == 0 ? SIZE_MAX : k - 1;
  std::vector<uint32_t> ver(n, 0);  // bumped when a symbol changes: older heap entries are stale
  struct Cand {
    int rank;
    size_t left, right;
    uint32_t vl, vr;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](size_t l) {
    if (l == SIZE_MAX || next[l] >= n) return;
    auto r = merge_rank_.find({sym[l], sym[next[l]]});
    if (r != merge_rank_.end()) heap.push(Cand{r->second, l, next[l], ver[l], ver[next[l]]});
  };
  for (size_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || ver[c.left] != c.vl || ver[c.right] != c.vr)
      continue;
    sym[c.left] += sym[c.right];
    ++ver[c.left];
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.right] < n) prev[next[c.right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  std::vector<std::string> out;
  for (size_t k = 0; k < n; k = next[k]) out.push_back(std::move(sym[k]));
  sym = std::move(out);
}

void Tokenizer::sp_bpe(const std::string& text, std::vector<int32_t>& out) const {
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  decode_utf8(text, cps, off);
  std::vector<std::string> sym;
  for (size_t i = 0; i < cps.size(); ++i) sym.push_back(text.substr(off[i], off[i + 1] - off[i]));
  merge(sym);
  for (const std::string& s : sym) {
    auto v = vocab_.find(s);
    if (v != vocab_.end()) {
      out.push_back(v->second);
    } else if (byte_fallback_) {
      for (unsigned char b : s) out.push_back(byte_token_[b]);
    } else {
      SF_CHECK(unk_ >= 0, "tokenizer: a symbol outside the vocabulary and no unk token");
      if (!(fuse_unk_ && !out.empty() && out.back() == unk_)) out.push_back(unk_);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = prefix_;
  size_t seg = 0, i = 0;
  auto flush = [&](size_t end) {
    if (end <= seg) return;
    if (split_ == Split::SentencePiece) {
      std::string norm = seg == 0 || sp_prepend_all_ ? "\xE2\x96\x81" : "";  // U+2581
      for (size_t k = seg; k < end; ++k) norm += text[k] == ' ' ? std::string("\xE2\x96\x81") : std::string(1, text[k]);
      sp_bpe(norm, out);
    } else {
      for (const std::string& piece : pre_tokenize(text.substr(seg, end - seg))) bpe(piece, out);
    }
  };
  while (i < text.size()) {
    bool hit = false;
    if (!added_first_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    for (const auto& [content, id] : added_) {
      if (text.compare(i, content.size(), content) == 0) {
        flush(i);
        out.push_back(id);
        i += content.size();
        seg = i;
        hit = true;
        break;
      }
    }
    if (!hit) ++i;
  }
  flush(text.size());
  if (add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const ByteMap& bm = byte_map();
  std::string out;
  if (split_ == Split::SentencePiece) {  // U+2581 -> space, <0xXX> -> the byte, one leading space off
    for (int32_t id : ids) {
      SF_CHECK(id >= 0 && size_t(id) < id_to_token_.size(), "tokenizer: id out of range");
      const int32_t* b = std::find(byte_token_, byte_token_ + 256, id);
      if (byte_fallback_ && b != byte_token_ + 256) {
        out += char(b - byte_token_);
        continue;
      }
      const std::string& tok = id_to_token_[size_t(id)];
      for (size_t k = 0; k < tok.size(); ++k) {
        if (tok.compare(k, 3, "\xE2\x96\x81") == 0) {
          out += ' ';
          k += 2;
        } else {
          out += tok[k];
        }
      }
    }
    if (!out.empty() && out[0] == ' ') out.erase(0, 1);
    return out;
  }
  for (int32_t id : ids) {
    SF_CHECK(id >= 0 && size_t(id) < id_to_token_.size(), "tokenizer: id out of range");
    bool added = false;
    for (const auto& [content, aid] : added_)
      if (aid == id) {
        out += content;
        added = true;
        break;
      }
    if (added) continue;
    std::vector<uint32_t> cps;
    std::vector<size_t> off;
    decode_utf8(id_to_token_[size_t(id)], cps, off);
    for (uint32_t cp : cps) {
      auto b = bm.to_byte.find(cp);
      SF_CHECK(b != bm.to_byte.end(), "tokenizer: not a byte-level token");
      out += char(b->second);
    }
  }
  return out;
}

}  // namespace sf
