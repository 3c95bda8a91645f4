#include "data/tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/thread_pool.h"
#include "data/tokenizer/bpe_scan.h"
#include "data/tokenizer/unicode.h"
#include "io/json_file.h"

namespace sf {

using nlohmann::json;
using tokjson::Ctx;
using tokjson::idx_path;
using tokjson::key_path;

namespace {

constexpr int kMaxDepth = 256;  // JSON nesting of a tokenizer.json (real files: < 10)

// Rejects nesting deeper than kMaxDepth before parsing, so that nothing recursive (the parser, the
// destructor) sees deeper input.
void check_depth(const std::string& text, const std::string& path) {
  int depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_str) {
      if (ch == '\\')
        ++i;
      else if (ch == '"')
        in_str = false;
    } else if (ch == '"') {
      in_str = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > kMaxDepth)
        input_error(path, "JSON nested deeper than " + std::to_string(kMaxDepth) + " levels (at byte " +
                              std::to_string(i) + ")");
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
}

std::atomic<uint64_t> g_serial{1};

// Per-thread cache of the ids of pieces (pieces repeat: words), for one tokenizer at a time:
// direct-mapped slots holding key and ids, a new piece replaces the old one in its slot (no growth,
// no clearing, no allocation).
struct PieceCache {
  static constexpr size_t kSlots = 1 << 15;  // about 4.5 MB a thread
  static constexpr size_t kMaxKey = 64;      // bytes
  static constexpr size_t kMaxIds = 14;
  struct Slot {
    uint64_t hash = 0;
    uint8_t len = 0, n = 0;  // of key, of ids
    char key[kMaxKey];
    int32_t ids[kMaxIds];
  };
  uint64_t serial = 0;
  std::vector<Slot> slots;
};
PieceCache& piece_cache(uint64_t serial) {
  thread_local PieceCache c;
  if (c.serial != serial) {
    c.slots.assign(PieceCache::kSlots, PieceCache::Slot{});
    c.serial = serial;
  }
  return c;
}

// Per-thread buffers of the encoder (reused: no allocation per piece once grown).
struct Scratch {
  std::vector<int32_t> sym;                          // a piece's symbols
  std::string mapped;                                // a piece in GPT-2's byte characters
  std::vector<std::pair<uint32_t, uint32_t>> spans;  // byte-level pieces
  std::vector<size_t> next, prev;                    // merge() of long pieces
  std::vector<uint32_t> ver;
  std::vector<uint8_t> alive;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// GPT-2's byte characters (printable bytes as themselves, the others from U+0100 on) back to
// their bytes; -1 for any other code point.
int gpt2_byte(uint32_t cp) {
  static const std::vector<int16_t> inv = [] {
    std::vector<int16_t> v(256 + 68, -1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      v[size_t(printable ? b : 256 + n++)] = int16_t(b);
    }
    return v;
  }();
  return cp < inv.size() ? inv[cp] : -1;
}

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

// GPT-2's byte characters as UTF-8 (ByteLevel's mapping of one byte).
struct ByteChars {
  char text[256][2];
  uint8_t len[256];
  ByteChars() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      std::string u;
      uni::append_utf8(u, printable ? uint32_t(b) : uint32_t(256 + n++));
      len[b] = uint8_t(u.size());
      std::copy(u.begin(), u.end(), text[b]);
    }
  }
};
const ByteChars& byte_chars() {
  static const ByteChars c;
  return c;
}

// A code point as a canonical UTF-8 sequence of 3 or 4 bytes at p (n of them): the code point, or
// UINT32_MAX when the bytes are not exactly that.
uint32_t wide_code_point(const unsigned char* p, size_t n) {
  for (size_t k = 1; k < n; ++k)
    if ((p[k] >> 6) != 2) return UINT32_MAX;
  uint32_t cp;
  if (n == 3 && (p[0] >> 4) == 14) {
    cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return UINT32_MAX;
  } else if (n == 4 && (p[0] >> 3) == 30) {
    cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
    if (cp < 0x10000 || cp > 0x10FFFF) return UINT32_MAX;
  } else {
    return UINT32_MAX;
  }
  return cp;
}
}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) input_error(path, "is a directory, not a tokenizer.json");
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error(path, "not found or not readable");
  // Read in chunks up to a bound (real files are under 50 MB; /dev/zero must not fill memory),
  // straight into the text, sized once for a regular file.
  constexpr size_t kMaxBytes = size_t(256) << 20;
  constexpr size_t kChunk = size_t(1) << 20;
  std::string text;
  if (const auto size = std::filesystem::file_size(path, ec); !ec)
    text.reserve(std::min<size_t>(size, kMaxBytes) + kChunk);
  for (;;) {
    const size_t old = text.size();
    text.resize(old + kChunk);
    in.read(text.data() + old, std::streamsize(kChunk));
    text.resize(old + size_t(in.gcount()));
    if (in.gcount() == 0) break;
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] != '{')
      input_error(path, "not a JSON object (a tokenizer.json starts with '{')");
    if (text.size() > kMaxBytes) input_error(path, "larger than 256 MiB: not a tokenizer.json");
  }
  if (in.bad()) input_error(path, "read error");
  return parse(text, path);
}

namespace {

// tokenizer.json's top level: an object of a known version, without truncation or padding.
void check_top_level(const Ctx& c, const json& j) {
  c.obj(j, "");
  if (const json* v = c.opt(j, "", "version"))
    if (c.str(*v, "version") != "1.0")
      c.fail("version", "unknown tokenizer version '" + v->get<std::string>().substr(0, 20) + "'");
  for (const char* k : {"truncation", "padding"})
    if (c.opt(j, "", k)) c.fail(k, std::string(k) + " is not supported (set it to null)");
}

// The model object: BPE without dropout or subword affixes.
const json& bpe_model(const Ctx& c, const json& j) {
  const json& m = c.obj(c.at(j, "", "model"), "model");
  const std::string mtype = c.str_or(m, "model", "type", "BPE");
  if (mtype != "BPE") c.fail("model.type", "model " + mtype.substr(0, 40) + " is not supported (BPE only)");
  if (const json* d = c.opt(m, "model", "dropout"))
    if (!d->is_number() || d->get<double>() != 0.0) c.fail("model.dropout", "BPE dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = c.opt(m, "model", k))
      if (!c.str(*v, std::string("model.") + k).empty()) c.fail(std::string("model.") + k, "not supported");
  return m;
}

// model.vocab: ids below `bound` (vocabulary and added tokens together: nothing is sized from an id
// before it is checked), each used once; `seen` marks the ids used.
void read_vocab(const Ctx& c, const json& vocab, int64_t bound, VocabIndex& ids, std::vector<std::string>& id_to_token,
                std::vector<uint8_t>& seen) {
  seen.assign(size_t(bound), 0);
  id_to_token.assign(size_t(bound), std::string());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    // The JSON path is built only for a value that is not a plain id (its error names it).
    const int64_t id = it.value().is_number_unsigned() ? int64_t(std::min<uint64_t>(it.value().get<uint64_t>(), INT64_MAX))
                                                       : c.integer(it.value(), key_path("model.vocab", it.key()), 0, INT64_MAX);
    if (id >= bound)
      c.fail(key_path("model.vocab", it.key()), "id " + std::to_string(id) + " is not below " + std::to_string(bound) +
                                                    ", the number of tokens (vocab and added tokens)");
    if (seen[size_t(id)]) c.fail(key_path("model.vocab", it.key()), "id " + std::to_string(id) + " is used twice");
    seen[size_t(id)] = 1;
    ids.insert(it.key(), int32_t(id));  // keys of a JSON object are distinct
    id_to_token[size_t(id)] = it.key();
  }
}

// The same from a scanned vocabulary (bpe_scan.h); false at the first problem (the tree path then
// reports it).
bool take_scanned_vocab(const VocabIndex& vocab, int64_t bound, std::vector<std::string>& id_to_token,
                        std::vector<uint8_t>& seen) {
  seen.assign(size_t(bound), 0);
  id_to_token.assign(size_t(bound), std::string());
  bool ok = true;
  vocab.each([&](std::string_view tok, int32_t id) {
    if (!ok || id >= bound || seen[size_t(id)]) {
      ok = false;
      return;
    }
    seen[size_t(id)] = 1;
    id_to_token[size_t(id)] = tok;
  });
  return ok;
}

// One merge entry ("a b" or ["a", "b"]) as its two parts; false for a "#version" line.
// `i` is the entry's index (its JSON path is built only for an error: loading 10^5 merges).
bool merge_parts(const Ctx& c, const json& e, size_t i, bool strings, std::string& a, std::string& b) {
  const auto p = [i] { return idx_path("model.merges", i); };
  if (e.is_string() != strings) c.fail(p(), "merges must be all strings \"a b\" or all pairs [\"a\", \"b\"]");
  if (e.is_string()) {
    const std::string& s = e.get_ref<const std::string&>();
    if (s.rfind("#version", 0) == 0) return false;
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      c.fail(p(), "a merge must be two symbols separated by one space");
    a.assign(s, 0, sp);
    b.assign(s, sp + 1);
  } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
    a = e[0].get_ref<const std::string&>();
    b = e[1].get_ref<const std::string&>();
  } else if (e.is_array() && e.size() == 2) {
    a = c.str(e[0], idx_path(p(), 0));
    b = c.str(e[1], idx_path(p(), 1));
  } else {
    c.fail(p(), "a merge must be \"a b\" or [\"a\", \"b\"]");
  }
  return true;
}

// A merge as the table holds it: key (left id << 32 | right id) + 1 (0: none, e.g. a "#version"
// line) and the id of the joined token.
struct MergeFound {
  uint64_t key;
  int32_t id;
};

// The merge of parts a and b (ab: the two joined); key 0 when one of the three is not a token
// (*missing: which one).
MergeFound find_merge_ids(const VocabIndex& vocab, std::string_view a, std::string_view b, std::string_view ab,
                          std::string_view* missing) {
  const int32_t ia = vocab.find(a), ib = vocab.find(b), ir = vocab.find(ab);
  if (ia < 0 || ib < 0 || ir < 0) {
    if (missing) *missing = ia < 0 ? a : ib < 0 ? b : ab;
    return MergeFound{0, -1};
  }
  return MergeFound{((uint64_t(uint32_t(ia)) << 32) | uint32_t(ib)) + 1, ir};
}

// fn(begin, end) over [0, n) on a few threads of its own (a load may run inside a task of the
// process's pool), at least 8192 items each; the first exception by range is rethrown.
template <class Fn>
void split_on_threads(size_t n, Fn&& fn) {
  const size_t threads = std::min<size_t>(size_t(std::max(1, usable_cpus())), std::max<size_t>(1, n / 8192));
  if (threads <= 1) return fn(size_t(0), n);
  std::vector<std::exception_ptr> errors(threads);
  std::vector<std::thread> pool;
  const size_t per = (n + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        fn(std::min(n, t * per), std::min(n, (t + 1) * per));
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// The open-addressing table of Slot{key, rank, id} (Tokenizer::MergeSlot) from the merges in file
// order; ranks count the real merges; a repeated pair takes its last rank (tokenizers collects them
// into a map).
template <class Slot>
void fill_merge_table(const std::vector<MergeFound>& found, std::vector<Slot>& merges) {
  size_t cap = 16;
  while (cap < found.size() * 2) cap *= 2;
  merges.assign(cap, Slot{0, 0, 0});
  int32_t rank = 0;
  for (const MergeFound& f : found) {
    if (f.key == 0) continue;
    for (size_t h = mix(f.key) & (cap - 1);; h = (h + 1) & (cap - 1)) {
      Slot& slot = merges[h];
      if (slot.key == 0 || slot.key == f.key) {
        slot = Slot{f.key, rank, f.id};
        break;
      }
    }
    ++rank;
  }
}

// model.merges from the tree, each merge's (key, id) in `found`. Parts and result must be in the
// vocabulary (as tokenizers checks at load). tokenizers needs both vocab and merges, the merges all
// "a b" strings (lines "#version..." skipped) or all pairs.
void read_merges(const Ctx& c, const json& m, const VocabIndex& vocab, std::vector<MergeFound>& found) {
  const json& ms = c.arr(c.at(m, "model", "merges"), "model.merges");
  const bool strings = !ms.empty() && ms[0].is_string();
  // The vocabulary look-ups (three a merge, 10^5 merges) on a few threads, each entry's (key, id) in
  // place; the first error by index is the one a serial loop would meet.
  found.assign(ms.size(), MergeFound{0, 0});
  split_on_threads(ms.size(), [&](size_t begin, size_t end) {
    std::string a, b, ab;
    for (size_t i = begin; i < end; ++i) {
      if (!merge_parts(c, ms[i], i, strings, a, b)) continue;
      ab.assign(a).append(b);
      std::string_view missing;
      found[i] = find_merge_ids(vocab, a, b, ab, &missing);
      if (found[i].key == 0)
        c.fail(idx_path("model.merges", i), "'" + std::string(missing.substr(0, 60)) + "' is not in the vocabulary");
    }
  });
}

// The same from scanned merges; false when a part or result is not a token (the tree path then
// reports it).
bool find_scanned_merges(const ScannedBpe& s, const VocabIndex& vocab, std::vector<MergeFound>& found) {
  found.assign(s.merges.size(), MergeFound{0, 0});
  std::atomic<bool> ok{true};
  split_on_threads(s.merges.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end && ok.load(std::memory_order_relaxed); ++i) {
      const ScannedBpe::Merge& m = s.merges[i];
      found[i] = find_merge_ids(vocab, s.left(m), s.right(m), s.joined(m), nullptr);
      if (found[i].key == 0) ok = false;
    }
  });
  return ok;
}

// SentencePiece-style: where long pieces may be cut (see Tokenizer::model()): before each word
// break, when the break is a token and no token has it after another character; "" when not safe.
std::string safe_word_break(const VocabIndex& vocab, const PreTokenizer& pre) {
  const std::string wb = pre.metaspace() ? pre.meta_replacement() : std::string("\xE2\x96\x81");
  bool safe = vocab.contains(wb);
  vocab.each([&](std::string_view tok, int32_t) {
    if (!safe || tok.find(wb) == std::string_view::npos) return;
    // Only breaks at the start, or after breaks, are allowed.
    size_t lead = 0;
    while (tok.substr(lead, wb.size()) == wb) lead += wb.size();
    safe = tok.find(wb, lead) == std::string_view::npos;
  });
  return safe ? wb : std::string();
}

// One added token's id as Hugging Face tokenizers gives it: its vocabulary id, else the id of an
// earlier entry with the same content, else the next id after the vocabulary (in file order).
int32_t hf_added_id(const VocabIndex& vocab, const std::unordered_map<std::string, int32_t>& added_ids,
                    const std::string& content, int32_t& next_id) {
  if (const int32_t v = vocab.find(content); v >= 0) return v;
  if (auto e = added_ids.find(content); e != added_ids.end()) return e->second;
  return next_id++;
}

// added_tokens into `out` (Tokenizer::Added{pattern, id, normalized}): every flag required (tokenizers'
// AddedToken has no defaults), ids as tokenizers gives them (a file whose ids say otherwise is refused
// rather than silently renumbered), the content normalized where the token says so; the ids' texts go
// to id_to_token (below its size, `bound`).
template <class AddedT>
void read_added_tokens(const Ctx& c, const json& added, const VocabIndex& vocab, const Normalizer& normalizer,
                       std::vector<std::string>& id_to_token, std::vector<AddedT>& out) {
  const int64_t bound = int64_t(id_to_token.size());
  int32_t next_id = int32_t(vocab.size());
  std::unordered_map<std::string, int32_t> added_ids;
  for (size_t i = 0; i < added.size(); ++i) {
    const std::string p = idx_path("added_tokens", i);
    const json& a = c.obj(added[i], p);
    const int64_t id = c.integer(c.at(a, p, "id"), p + ".id", 0, UINT32_MAX);
    const std::string content = c.str(c.at(a, p, "content"), p + ".content");
    const bool normalized = c.boolean(c.at(a, p, "normalized"), p + ".normalized");
    c.boolean(c.at(a, p, "special"), p + ".special");
    for (const char* k : {"single_word", "lstrip", "rstrip"})
      if (c.boolean(c.at(a, p, k), p + "." + k)) c.fail(p + "." + k, std::string(k) + " = true is not supported");
    if (content.empty()) continue;  // tokenizers ignores it
    const int32_t hf_id = hf_added_id(vocab, added_ids, content, next_id);
    if (id != hf_id)
      c.fail(p + ".id", "'" + content.substr(0, 60) + "' has id " + std::to_string(id) +
                            " but Hugging Face tokenizers gives it " + std::to_string(hf_id));
    if (hf_id >= bound) c.fail(p + ".id", "out of range");
    const std::string& existing = id_to_token[size_t(hf_id)];
    if (!existing.empty() && existing != content)
      c.fail(p + ".id", "id " + std::to_string(hf_id) + " is already the token '" + existing.substr(0, 60) + "'");
    id_to_token[size_t(hf_id)] = content;
    added_ids[content] = hf_id;
    std::string pattern = content;
    if (normalized && !normalizer.empty()) {
      bool at_start = true;
      normalizer.apply(pattern, at_start);
      if (pattern.empty()) continue;
    }
    auto dup = std::find_if(out.begin(), out.end(), [&](const AddedT& x) { return x.id == hf_id; });
    if (dup != out.end()) out.erase(dup);
    out.push_back({pattern, hf_id, normalized});  // normalized ones: a second pass, even without a normalizer
  }
}

// Post-processor: TemplateProcessing (alone or in a Sequence); ByteLevel changes only offsets. The
// template's special-token ids (below n_ids) go to prefix (before the sequence A) or suffix.
void read_post_processor(const Ctx& c, const json& p, const std::string& path, int depth, int64_t n_ids,
                         std::vector<int32_t>& prefix, std::vector<int32_t>& suffix);

void read_template_processing(const Ctx& c, const json& p, const std::string& path, int64_t n_ids,
                              std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  const json& single = c.arr(c.at(p, path, "single"), path + ".single");
  const json& specials = c.obj(c.at(p, path, "special_tokens"), path + ".special_tokens");
  c.arr(c.at(p, path, "pair"), path + ".pair");  // required by tokenizers, unused here
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string ip = idx_path(path + ".single", i);
    const json& item = c.obj(single[i], ip);
    if (const json* s = c.opt(item, ip, "Sequence")) {
      const std::string id = c.str(c.at(*s, ip + ".Sequence", "id"), ip + ".Sequence.id");
      if (id != "A" || seen_a) c.fail(ip, "the single template must hold the sequence A once");
      seen_a = true;
    } else if (const json* s = c.opt(item, ip, "SpecialToken")) {
      const std::string name = c.str(c.at(*s, ip + ".SpecialToken", "id"), ip + ".SpecialToken.id");
      const json* st = c.opt(specials, path + ".special_tokens", name.c_str());
      if (!st) c.fail(ip, "no special token '" + name.substr(0, 60) + "' in special_tokens");
      const std::string sp = key_path(path + ".special_tokens", name);
      const json& ids = c.arr(c.at(*st, sp, "ids"), sp + ".ids");
      const json& toks = c.arr(c.at(*st, sp, "tokens"), sp + ".tokens");
      if (toks.size() != ids.size()) c.fail(sp, "ids and tokens differ in length");
      for (size_t k = 0; k < ids.size(); ++k)
        (seen_a ? suffix : prefix).push_back(int32_t(c.integer(ids[k], idx_path(sp + ".ids", k), 0, n_ids - 1)));
    } else {
      c.fail(ip, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  if (!seen_a) c.fail(path + ".single", "the single template has no sequence A");
}

void read_post_processor(const Ctx& c, const json& p, const std::string& path, int depth, int64_t n_ids,
                         std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (p.is_null()) return;
  if (depth > 16) c.fail(path, "nested too deep");
  const std::string type = c.type(p, path);
  if (type == "Sequence") {
    c.each(p, path, "processors", [&](const json& item, const std::string& ip) {
      read_post_processor(c, item, ip, depth + 1, n_ids, prefix, suffix);
    });
  } else if (type == "TemplateProcessing") {
    read_template_processing(c, p, path, n_ids, prefix, suffix);
  } else if (type != "ByteLevel") {
    c.fail(path, "post_processor " + type.substr(0, 60) + " is not supported");
  }
}

}  // namespace

Tokenizer Tokenizer::parse(const std::string& text, const std::string& path) {
  // The file's hash (fingerprint()) beside the scan: 8 bytes a step, ~4 ms for 9 MB.
  uint64_t text_hash = 0;
  std::jthread hasher([&] { text_hash = hash_text(text); });
  {  // model.vocab and model.merges straight from the text, the rest through the parser (bpe_scan.h)
    ScannedBpe scanned;
    if (scan_bpe(text, scanned)) {
      // The checks below on the rest alone: the scanned values hold no NUL, exponent or nesting
      // beyond 3 (the whole text passes them when the rest does). A rest that fails them, or
      // the parser, is reported from the whole text (its byte offsets).
      bool checked = true;
      try {
        check_depth(scanned.rest, path);
        check_json_text(path, scanned.rest.data(), scanned.rest.data() + scanned.rest.size());
      } catch (const InputError&) {
        checked = false;
      }
      const json rest =
          checked ? json::parse(scanned.rest, nullptr, /*allow_exceptions=*/false) : json(json::value_t::discarded);
      hasher.join();
      if (!rest.is_discarded())
        if (std::optional<Tokenizer> t = build(path, rest, &scanned, text_hash)) return std::move(*t);
    }
  }
  check_depth(text, path);
  check_json_text(path, text.data(), text.data() + text.size());  // NUL, 1e999 (io/json_file.h)
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    input_error(path, "invalid JSON: " + describe_json_parse_error(e).substr(0, 300));
  }
  if (hasher.joinable()) hasher.join();
  return std::move(*build(path, j, nullptr, text_hash));
}

std::optional<Tokenizer> Tokenizer::build(const std::string& path, const json& j, ScannedBpe* scanned,
                                          uint64_t text_hash) {
  const Ctx c{path};
  Tokenizer t;
  t.serial_ = g_serial.fetch_add(1);
  constexpr uint64_t kRevision = 3;  // bump when the ids of some file change
  const uint64_t h = 1469598103934665603ULL ^ kRevision;
  t.fingerprint_ = mix(h ^ text_hash);
  check_top_level(c, j);

  const json& m = bpe_model(c, j);
  t.ignore_merges_ = c.bool_or(m, "model", "ignore_merges", false);
  t.byte_fallback_ = c.bool_or(m, "model", "byte_fallback", false);
  t.fuse_unk_ = c.bool_or(m, "model", "fuse_unk", false);
  const json& vocab = c.obj(c.at(m, "model", "vocab"), "model.vocab");
  const json& added = j.contains("added_tokens") && !j["added_tokens"].is_null()
                          ? c.arr(j["added_tokens"], "added_tokens")
                          : json::array();
  const int64_t bound = int64_t(scanned ? scanned->vocab.size() : vocab.size()) + int64_t(added.size());
  if (bound > (int64_t(1) << 30)) c.fail("model.vocab", "too many tokens");
  std::vector<uint8_t> seen;
  std::vector<MergeFound> found;
  if (scanned) {
    if (!take_scanned_vocab(scanned->vocab, bound, t.id_to_token_, seen) ||
        !find_scanned_merges(*scanned, scanned->vocab, found))
      return std::nullopt;
    t.vocab_ = std::move(scanned->vocab);
  } else {
    read_vocab(c, vocab, bound, t.vocab_, t.id_to_token_, seen);
    read_merges(c, m, t.vocab_, found);
  }
  // The merge table is filled (one pass in file order: ~20 ms for 280k merges) while the rest is
  // read; joined before t is returned or destroyed.
  std::jthread fill([&t, &found] { fill_merge_table(found, t.merges_); });
  t.char_id_.assign(0x800, -1);
  for (uint32_t cp = 0; cp < 0x800; ++cp) {
    std::string ch;
    uni::append_utf8(ch, cp);
    t.char_id_[cp] = t.vocab_.find(ch);
  }
  {  // single code points from U+0800 (CJK characters and the like): open addressing by code point
    std::vector<std::pair<uint32_t, int32_t>> wide;
    t.vocab_.each([&](std::string_view tok, int32_t id) {
      if (const uint32_t cp = wide_code_point(reinterpret_cast<const unsigned char*>(tok.data()), tok.size());
          cp != UINT32_MAX)
        wide.push_back({cp, id});
    });
    size_t cap = 16;
    while (cap < wide.size() * 2) cap *= 2;
    t.wide_char_.assign(cap, {0, -1});
    for (const auto& [cp, id] : wide)
      for (size_t h = mix(cp) & (cap - 1);; h = (h + 1) & (cap - 1))
        if (t.wide_char_[h].first == 0) {
          t.wide_char_[h] = {cp, id};
          break;
        }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    t.byte_token_[b] = t.vocab_.find(name);
  }
  if (const json* u = c.opt(m, "model", "unk_token")) {
    const std::string unk = c.str(*u, "model.unk_token");
    t.unk_ = t.vocab_.find(unk);
    if (t.unk_ < 0) c.fail("model.unk_token", "'" + unk.substr(0, 60) + "' is not in the vocabulary");
  }

  t.normalizer_ = Normalizer::from_json(c, j.value("normalizer", json()), "normalizer");
  t.pre_ = PreTokenizer::from_json(c, j.value("pre_tokenizer", json()), "pre_tokenizer");
  if (!t.pre_.byte_level() && !t.ignore_merges_) t.word_break_ = safe_word_break(t.vocab_, t.pre_);
  read_added_tokens(c, added, t.vocab_, t.normalizer_, t.id_to_token_, t.added_);
  // Matching: longest first, indexed by first byte; ids up to the last one used.
  std::stable_sort(t.added_.begin(), t.added_.end(),
                   [](const Added& x, const Added& y) { return x.content.size() > y.content.size(); });
  t.any_normalized_ = std::any_of(t.added_.begin(), t.added_.end(), [](const Added& a) { return a.normalized; });
  for (size_t k = 0; k < t.added_.size(); ++k)
    t.added_by_byte_[t.added_[k].normalized][static_cast<unsigned char>(t.added_[k].content[0])].push_back(uint32_t(k));
  size_t used = 0;
  for (size_t k = 0; k < t.id_to_token_.size(); ++k)
    if (!t.id_to_token_[k].empty() || (k < seen.size() && seen[k])) used = k + 1;
  t.id_to_token_.resize(used);
  if (t.pre_.byte_level()) t.token_bytes_ = t.byte_lengths();
  read_post_processor(c, j.value("post_processor", json()), "post_processor", 0, t.vocab_size(), t.prefix_, t.suffix_);
  if (const json* d = c.opt(j, "", "decoder")) c.obj(*d, "decoder");
  fill.join();
  return t;
}

const Tokenizer::MergeSlot* Tokenizer::find_merge(int32_t a, int32_t b) const {
  if (merges_.empty()) return nullptr;
  const uint64_t key = ((uint64_t(uint32_t(a)) << 32) | uint32_t(b)) + 1;
  const size_t mask = merges_.size() - 1;
  for (size_t h = mix(key) & mask;; h = (h + 1) & mask) {
    const MergeSlot& s = merges_[h];
    if (s.key == key) return &s;
    if (s.key == 0) return nullptr;
  }
}

// The lowest-ranked adjacent pair first, leftmost among equal ranks (as tokenizers' Word::merge_all).
void Tokenizer::merge(std::vector<int32_t>& sym) const {
  const size_t n = sym.size();
  if (n < 2) return;
  if (n <= 64) {
    // Short pieces (words): the rank and result of each adjacent pair, kept up to date; each merge
    // looks up only the two pairs it changes, and the scan for the lowest rank is over integers.
    int32_t rank[64], id[64];
    auto pair_at = [&](size_t k) {
      if (const MergeSlot* s = find_merge(sym[k], sym[k + 1]))
        rank[k] = s->rank, id[k] = s->id;
      else
        rank[k] = INT32_MAX, id[k] = -1;
    };
    for (size_t k = 0; k + 1 < n; ++k) pair_at(k);
    size_t len = n;
    while (len > 1) {
      int32_t best = INT32_MAX;
      size_t at = 0;
      for (size_t k = 0; k + 1 < len; ++k)
        if (rank[k] < best) best = rank[k], at = k;
      if (best == INT32_MAX) break;
      sym[at] = id[at];
      // Symbols after the pair move one to the left, and so do the pairs after it.
      for (size_t k = at + 1; k + 1 < len; ++k) sym[k] = sym[k + 1];
      for (size_t k = at + 1; k + 2 < len; ++k) rank[k] = rank[k + 1], id[k] = id[k + 1];
      --len;
      if (at > 0) pair_at(at - 1);
      if (at + 1 < len) pair_at(at);
    }
    sym.resize(len);
    return;
  }
  // Long ones: a heap over a linked list, O(n log n).
  Scratch& sc = scratch();
  std::vector<size_t>& next = sc.next;
  std::vector<size_t>& prev = sc.prev;
  std::vector<uint32_t>& ver = sc.ver;  // bumped when a symbol changes: older heap entries are stale
  std::vector<uint8_t>& alive = sc.alive;
  next.resize(n);
  prev.resize(n);
  ver.assign(n, 0);
  alive.assign(n, 1);
  for (size_t k = 0; k < n; ++k) next[k] = k + 1, prev[k] = k == 0 ? SIZE_MAX : k - 1;
  struct Cand {
    int32_t rank, id;
    size_t left, right;
    uint32_t vl, vr;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](size_t l) {
    if (l == SIZE_MAX || next[l] >= n) return;
    if (const MergeSlot* s = find_merge(sym[l], sym[next[l]]))
      heap.push(Cand{s->rank, s->id, l, next[l], ver[l], ver[next[l]]});
  };
  for (size_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    const Cand cd = heap.top();
    heap.pop();
    if (!alive[cd.left] || !alive[cd.right] || next[cd.left] != cd.right || ver[cd.left] != cd.vl ||
        ver[cd.right] != cd.vr)
      continue;
    sym[cd.left] = cd.id;
    ++ver[cd.left];
    alive[cd.right] = 0;
    next[cd.left] = next[cd.right];
    if (next[cd.right] < n) prev[next[cd.right]] = cd.left;
    push(prev[cd.left]);
    push(cd.left);
  }
  size_t w = 0;
  for (size_t k = 0; k < n; k = next[k]) sym[w++] = sym[k];
  sym.resize(w);
}

int32_t Tokenizer::wide_char_id(uint32_t cp) const {
  if (wide_char_.empty()) return -1;
  const size_t mask = wide_char_.size() - 1;
  for (size_t h = mix(cp) & mask;; h = (h + 1) & mask) {
    if (wide_char_[h].first == cp) return wide_char_[h].second;
    if (wide_char_[h].first == 0) return -1;
  }
}

// The BPE model on one piece (tokenizers' BPE::tokenize).
void Tokenizer::model(std::string_view piece, std::vector<int32_t>& out) const {
  if (word_break_.empty() || piece.size() <= PieceCache::kMaxKey) return model_word(piece, out);
  // A long SentencePiece-style piece (a whole segment): no token holds the word break (U+2581)
  // after another character, so no merge crosses the place before it and the words are
  // independent: each goes through BPE (and the cache) alone, with the same result.
  size_t a = 0;
  const std::string_view wb = word_break_;
  for (size_t k = piece.find(wb, 1); k != std::string::npos; k = piece.find(wb, k + wb.size())) {
    if (k >= wb.size() && piece.compare(k - wb.size(), wb.size(), wb) == 0) continue;  // inside a run of breaks
    model_word(piece.substr(a, k - a), out);
    a = k;
  }
  model_word(piece.substr(a), out);
}

namespace {

// The cache's slot for a piece, and whether it holds the piece's ids; nullptr for pieces too long to
// be cached (and the empty one).
PieceCache::Slot* cache_slot(uint64_t serial, std::string_view piece, uint64_t& hash, bool& hit) {
  hit = false;
  if (piece.empty() || piece.size() > PieceCache::kMaxKey) return nullptr;
  hash = hash_text(piece);
  PieceCache::Slot* slot = &piece_cache(serial).slots[hash & (PieceCache::kSlots - 1)];
  hit = slot->hash == hash && slot->len == piece.size() && std::memcmp(slot->key, piece.data(), piece.size()) == 0;
  return slot;
}

void cache_store(PieceCache::Slot* slot, uint64_t hash, std::string_view piece, const std::vector<int32_t>& ids) {
  if (!slot || ids.size() > PieceCache::kMaxIds) return;
  slot->hash = hash;
  slot->len = uint8_t(piece.size());
  std::memcpy(slot->key, piece.data(), piece.size());
  slot->n = uint8_t(ids.size());
  std::copy(ids.begin(), ids.end(), slot->ids);
}

// The ids of `key` from the piece cache, else those `compute()` returns (cached for next time).
template <class F>
void cached_ids(uint64_t serial, std::string_view key, std::vector<int32_t>& out, F&& compute) {
  uint64_t hash = 0;
  bool hit;
  PieceCache::Slot* slot = cache_slot(serial, key, hash, hit);
  if (hit) {
    out.insert(out.end(), slot->ids, slot->ids + slot->n);
    return;
  }
  const std::vector<int32_t>& ids = compute();
  out.insert(out.end(), ids.begin(), ids.end());
  cache_store(slot, hash, key, ids);
}

}  // namespace

void Tokenizer::model_word(std::string_view piece, std::vector<int32_t>& out) const {
  cached_ids(serial_, piece, out, [&]() -> const std::vector<int32_t>& {
    std::vector<int32_t>& sym = scratch().sym;
    word_ids(piece, sym);
    return sym;
  });
}

// A byte-level piece given as its bytes (before ByteLevel's mapping): the cache is keyed by the
// bytes, the mapping made only for pieces not in it.
void Tokenizer::model_bytes(std::string_view raw, std::vector<int32_t>& out) const {
  cached_ids(serial_, raw, out, [&]() -> const std::vector<int32_t>& {
    Scratch& sc = scratch();
    const ByteChars& bc = byte_chars();
    sc.mapped.clear();
    for (unsigned char b : raw) sc.mapped.append(bc.text[b], bc.len[b]);
    word_ids(sc.mapped, sc.sym);
    return sc.sym;
  });
}

// The ids of one piece through the model: its characters as symbols, then the merges.
void Tokenizer::word_ids(std::string_view piece, std::vector<int32_t>& sym) const {
  sym.clear();
  if (ignore_merges_) {
    if (const int32_t v = vocab_.find(piece); v >= 0) {
      sym.push_back(v);
      return;
    }
  }
  sym.reserve(piece.size());
  int32_t pending_unk = -1;  // an unknown run not yet added (tokenizers adds it lazily)
  const auto* p = reinterpret_cast<const unsigned char*>(piece.data());
  for (size_t i = 0; i < piece.size();) {
    const unsigned char b = p[i];
    const size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
    const size_t l = std::min(len, piece.size() - i);
    int32_t id = -1;
    if (l == 1 && b < 0x80) {
      id = char_id_[b];
    } else if (l == 2 && len == 2 && (p[i + 1] >> 6) == 2) {
      id = char_id_[((b & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu)];
    } else if (const uint32_t cp = wide_code_point(p + i, l); cp != UINT32_MAX) {
      id = wide_char_id(cp);
    } else {
      id = vocab_.find(piece.substr(i, l));  // bytes that are not a character (invalid UTF-8) as they are
    }
    if (id >= 0) {
      if (pending_unk >= 0) sym.push_back(pending_unk), pending_unk = -1;
      sym.push_back(id);
    } else {
      bool fell_back = false;
      if (byte_fallback_) {
        fell_back = true;
        for (size_t k = i; k < i + l; ++k) fell_back &= byte_token_[p[k]] >= 0;
        if (fell_back)
          for (size_t k = i; k < i + l; ++k) sym.push_back(byte_token_[p[k]]);
      }
      if (!fell_back && unk_ >= 0) {
        if (pending_unk >= 0 && !fuse_unk_) sym.push_back(pending_unk);
        pending_unk = unk_;
      }
      // No unk token and no byte fallback: tokenizers drops the character.
    }
    i += l;
  }
  if (pending_unk >= 0) sym.push_back(pending_unk);
  merge(sym);
}

void Tokenizer::segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<std::pair<uint32_t, uint32_t>>& spans = scratch().spans;
  if (pre_.byte_spans(text, spans)) {  // Llama 3, Qwen2, GPT-2
    for (const auto& [a, b] : spans) model_bytes(text.substr(a, b - a), out);
    return;
  }
  if (pre_.empty()) {  // SentencePiece-style without a pre-tokenizer (Llama 2, Mistral v0.1)
    model(text, out);
    return;
  }
  std::vector<Piece> pieces{Piece{std::string(text), at_start}};
  pre_.apply(pieces);
  for (const Piece& p : pieces) model(p.text, out);
}

// Splits text at the added tokens of one kind (matched on the raw text, or on normalized text),
// leftmost first and longest at a position, as tokenizers' Aho-Corasick LeftmostLongest:
// segs gets the [begin, end) of the text between them, ids the token after each segment (-1 last).
void Tokenizer::split_added(const std::string& text, bool normalized, std::vector<std::pair<size_t, size_t>>& segs,
                            std::vector<int32_t>& ids) const {
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    const std::vector<uint32_t>& cands = added_by_byte_[normalized][ch];  // longest first
    const Added* hit = nullptr;
    for (uint32_t k : cands)
      if (text.compare(i, added_[k].content.size(), added_[k].content) == 0) {
        hit = &added_[k];
        break;
      }
    if (!hit) {
      ++i;
      continue;
    }
    segs.push_back({seg, i});
    ids.push_back(hit->id);
    i += hit->content.size();
    seg = i;
  }
  segs.push_back({seg, text.size()});
  ids.push_back(-1);
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool add_special) const {
  std::vector<int32_t> out;
  out.reserve(prefix_.size() + suffix_.size() + text.size() / 3);
  if (add_special) out = prefix_;
  const bool any_normalized = any_normalized_;
  std::vector<std::pair<size_t, size_t>> segs;
  std::vector<int32_t> ids;
  split_added(text, false, segs, ids);
  std::string part;
  for (size_t s = 0; s < segs.size(); ++s) {
    if (segs[s].second > segs[s].first) {
      const std::string_view raw = std::string_view(text).substr(segs[s].first, segs[s].second - segs[s].first);
      const bool at_start = segs[s].first == 0;
      if (normalizer_.empty() && !any_normalized) {
        segment(raw, at_start, out);
      } else {
        encode_between_added(raw, at_start, part, out);
      }
    }
    if (ids[s] >= 0) out.push_back(ids[s]);
  }
  if (add_special) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

// A stretch of text between (raw) added tokens: normalized, then split at the normalized added tokens.
void Tokenizer::encode_between_added(std::string_view raw, bool at_start, std::string& part,
                                     std::vector<int32_t>& out) const {
  part.assign(raw);
  normalizer_.apply(part, at_start);
  if (!any_normalized_) {
    segment(part, at_start, out);
    return;
  }
  std::vector<std::pair<size_t, size_t>> segs;
  std::vector<int32_t> ids;
  split_added(part, true, segs, ids);
  for (size_t k = 0; k < segs.size(); ++k) {
    segment(std::string_view(part).substr(segs[k].first, segs[k].second - segs[k].first), at_start && segs[k].first == 0,
            out);
    if (ids[k] >= 0) out.push_back(ids[k]);
  }
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts, bool add_special,
                                                          int threads) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  if (threads <= 0) threads = usable_cpus();
  threads = int(std::min<size_t>(size_t(threads), (texts.size() + 15) / 16));
  if (threads <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) out[i] = encode(texts[i], add_special);
    return out;
  }
  // Records differ in length: workers take small chunks from a shared counter.
  std::atomic<size_t> next{0};
  std::exception_ptr err;
  std::mutex err_mu;
  auto work = [&] {
    try {
      for (size_t a; (a = next.fetch_add(16)) < texts.size();)
        for (size_t i = a; i < std::min(a + 16, texts.size()); ++i) out[i] = encode(texts[i], add_special);
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu);
      if (!err) err = std::current_exception();
      next = texts.size();
    }
  };
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (err) std::rethrow_exception(err);
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(const std::string& text) const {
  std::string norm = text;
  bool at_start = true;
  normalizer_.apply(norm, at_start);
  std::vector<Piece> pieces{Piece{norm, at_start}};
  if (norm.empty()) pieces.clear();
  pre_.apply(pieces);
  std::vector<std::string> out;
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  for (Piece& p : pieces) {
    if (pre_.byte_level()) {  // map GPT-2's byte characters back
      uni::decode_utf8(p.text, cps, off);
      std::string raw;
      for (uint32_t cp : cps) {
        if (const int b = gpt2_byte(cp); b >= 0) raw += char(b);
      }
      p.text = raw;
    }
    out.push_back(p.text);
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out = token_text(ids);
  // SentencePiece-style: the space prepended at encoding is taken off.
  if (!pre_.byte_level() && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string Tokenizer::token_piece(int32_t id) const {
  const int32_t* b = std::find(byte_token_, byte_token_ + 256, id);
  if (byte_fallback_ && b != byte_token_ + 256) return std::string(1, char(b - byte_token_));
  return id_to_token_.at(size_t(id));
}

// Byte-level: the bytes token_text({id}) gives for each id, without building the texts: encode_offsets
// adds them up along the tokens.
std::vector<uint32_t> Tokenizer::byte_lengths() const {
  std::vector<uint8_t> added_only(id_to_token_.size(), 0);
  for (const Added& a : added_)
    if (size_t(a.id) < added_only.size() && !vocab_.contains(a.content)) added_only[size_t(a.id)] = 1;
  std::vector<uint32_t> len(id_to_token_.size(), 0);
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  for (size_t id = 0; id < id_to_token_.size(); ++id) {
    const std::string& tok = id_to_token_[id];
    if (added_only[id]) {
      len[id] = uint32_t(tok.size());
      continue;
    }
    uni::decode_utf8(tok, cps, off);
    for (size_t k = 0; k < cps.size(); ++k) len[id] += gpt2_byte(cps[k]) >= 0 ? 1 : uint32_t(off[k + 1] - off[k]);
  }
  return len;
}

std::string Tokenizer::token_text(const std::vector<int32_t>& ids) const {
  std::string out;
  auto token_of = [&](int32_t id) -> const std::string& {
    if (id < 0 || size_t(id) >= id_to_token_.size())
      input_error("decode", "token id " + std::to_string(id) + " is out of range");
    return id_to_token_[size_t(id)];
  };
  auto is_added = [&](int32_t id) {
    return std::any_of(added_.begin(), added_.end(), [&](const Added& a) { return a.id == id; }) &&
           !vocab_.contains(id_to_token_[size_t(id)]);
  };
  if (pre_.byte_level()) {
    std::vector<uint32_t> cps;
    std::vector<size_t> off;
    for (int32_t id : ids) {
      const std::string& tok = token_of(id);
      if (is_added(id)) {
        out += tok;
        continue;
      }
      uni::decode_utf8(tok, cps, off);
      for (size_t k = 0; k < cps.size(); ++k) {
        const uint32_t cp = cps[k];
        const int b = gpt2_byte(cp);
        if (b >= 0)
          out += char(b);
        else
          out.append(tok, off[k], off[k + 1] - off[k]);
      }
    }
    return out;
  }
  // SentencePiece-style: the replacement character is a space, <0xXX> a byte.
  const std::string rep = pre_.metaspace() ? pre_.meta_replacement() : std::string("\xE2\x96\x81");
  for (int32_t id : ids) {
    const std::string& tok = token_of(id);
    const int32_t* b = std::find(byte_token_, byte_token_ + 256, id);
    if (byte_fallback_ && b != byte_token_ + 256) {
      out += char(b - byte_token_);
      continue;
    }
    if (is_added(id)) {
      out += tok;
      continue;
    }
    for (size_t k = 0; k < tok.size(); ++k) {
      if (tok.compare(k, rep.size(), rep) == 0) {
        out += ' ';
        k += rep.size() - 1;
      } else {
        out += tok[k];
      }
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode_offsets(const std::string& text, std::vector<std::pair<size_t, size_t>>& offsets,
                                               bool add_special) const {
  std::vector<int32_t> out;
  offsets.clear();
  if (add_special) {
    out = prefix_;
    offsets.assign(out.size(), {0, 0});
  }
  std::vector<std::pair<size_t, size_t>> segs;
  std::vector<int32_t> ids;
  split_added(text, false, segs, ids);
  std::vector<int32_t> seg_ids;
  for (size_t s = 0; s < segs.size(); ++s) {
    const auto [a, b] = segs[s];
    if (b > a) {
      // The segment's ids as encode() gives them (the normalized added tokens included).
      const std::string raw = text.substr(a, b - a);
      std::string part;
      seg_ids.clear();
      encode_between_added(raw, a == 0, part, seg_ids);
      const std::string& norm = part;  // the segment normalized (encode_between_added's first step)
      // Token k's bytes in the normalized segment: consecutive when the tokens spell it (a prepended
      // SentencePiece space stands before the first character).
      // Byte-level tokens are the text's bytes: their lengths suffice (each distinct id's once).
      // SentencePiece-style tokens spell the normalized text with their pieces as written (a
      // normalizer's '▁' stays '▁'), or, decoded, the text itself with a space put in front.
      const bool lossless = pre_.byte_level();
      std::vector<std::pair<size_t, size_t>> in_norm(seg_ids.size());
      size_t pos = 0;
      std::string spelled, pieces;
      std::vector<size_t> piece_len;  // (not byte-level) each token's piece, as written
      for (size_t k = 0; k < seg_ids.size(); ++k) {
        size_t len;
        if (lossless) {
          len = token_bytes_[size_t(seg_ids[k])];
        } else {
          const std::string t = token_text({seg_ids[k]});
          len = t.size();
          spelled += t;
          piece_len.push_back(pieces.size());
          pieces += token_piece(seg_ids[k]);
          piece_len.back() = pieces.size() - piece_len.back();
        }
        in_norm[k] = {pos, pos + len};
        pos += len;
      }
      size_t shift = 0;
      bool spells = lossless ? pos == norm.size() : spelled == norm;
      if (!lossless && !spells && pieces == norm) {
        pos = 0;
        for (size_t k = 0; k < seg_ids.size(); ++k) {
          in_norm[k] = {pos, pos + piece_len[k]};
          pos += piece_len[k];
        }
        spells = true;
      } else if (!lossless && !spells && spelled.size() == norm.size() + 1 && spelled[0] == ' ' &&
                 spelled.compare(1, std::string::npos, norm) == 0) {
        shift = 1;
        spells = true;
      }
      const bool unchanged = norm == raw;
      std::vector<std::pair<size_t, size_t>> origin;
      if (spells && !unchanged) origin = normalizer_.align(raw, a == 0);
      const bool exact = spells && (unchanged || origin.size() == norm.size());
      for (size_t k = 0; k < seg_ids.size(); ++k) {
        out.push_back(seg_ids[k]);
        if (!exact) {  // unknown alignment: every token of the segment spans it
          offsets.emplace_back(a, b);
          continue;
        }
        size_t x = in_norm[k].first, y = in_norm[k].second;
        x = x > shift ? x - shift : 0;
        y = y > shift ? y - shift : 0;
        if (y <= x) {  // the prepended space alone stands for the first character (tokenizers)
          offsets.emplace_back(a, a + (b > a ? uni::utf8_length(text, a) : 0));
          continue;
        }
        if (unchanged) {
          offsets.emplace_back(a + x, a + y);
        } else {
          offsets.emplace_back(a + origin[x].first, a + origin[y - 1].second);
        }
      }
    }
    if (ids[s] >= 0) {
      out.push_back(ids[s]);
      offsets.emplace_back(b, b + added_text_size(ids[s]));
    }
  }
  if (add_special) {
    out.insert(out.end(), suffix_.begin(), suffix_.end());
    offsets.resize(out.size(), {text.size(), text.size()});
  }
  return out;
}

size_t Tokenizer::added_text_size(int32_t id) const {
  for (const Added& x : added_)
    if (x.id == id) return x.content.size();
  return 0;
}

}  // namespace sf
