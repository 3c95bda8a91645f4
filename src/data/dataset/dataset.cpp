#include "data/dataset/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "data/template/chat.h"
#include "data/tokenizer/tokenizer.h"
#include "io/atomic_file.h"
#include "io/json_file.h"
#include "io/line_reader.h"

namespace sf {
namespace {

size_t g_max_record_bytes = kDefaultMaxRecordBytes;

// A record's nesting limit (records are 2 deep; unknown keys may hold more, but not without bound).
constexpr int kRecordMaxDepth = 64;

enum class Field { None, InputIds, Labels, Text, Prompt, Completion, Messages, Other };

const char* field_name(Field f) {
  switch (f) {
    case Field::InputIds:
      return "input_ids";
    case Field::Labels:
      return "labels";
    case Field::Text:
      return "text";
    case Field::Prompt:
      return "prompt";
    case Field::Completion:
      return "completion";
    case Field::Messages:
      return "messages";
    default:
      return "";
  }
}

// One JSONL line parsed as events (nlohmann's SAX interface, which is iterative): token ids go
// straight into int32 vectors, range-checked as they come, so a record costs 4 bytes per id and not
// a JSON tree; unknown keys are skipped. Every problem is an InputError naming `where`.
class RecordParser : public nlohmann::json_sax<nlohmann::json> {
 public:
  RecordParser(const std::string& where, int64_t vocab) : where_(where), vocab_(vocab) {}

  std::vector<int32_t> ids, labels;
  bool has_ids = false, has_labels = false, has_messages = false;
  std::optional<std::string> text, prompt, completion;

  bool null() override {
    if (value_at_top()) {
      if (field_ == Field::Labels) return true;  // "labels": null = not given
      if (field_ != Field::Other) wrong_type();
    }
    return element_or_skip("null");
  }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool number_integer(number_integer_t x) override {
    if (collecting()) return push(x, std::to_string(x));
    return scalar("a number");
  }
  bool number_unsigned(number_unsigned_t x) override {
    if (collecting()) return push(x > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(x), std::to_string(x));
    return scalar("a number");
  }
  bool number_float(number_float_t, const string_t& s) override {
    if (collecting()) not_integer(s.size() > 32 ? s.substr(0, 32) + "..." : s);
    return scalar("a number");
  }
  bool string(string_t& v) override {
    if (value_at_top()) {
      if (field_ == Field::Text) text = std::move(v);
      if (field_ == Field::Prompt) prompt = std::move(v);
      if (field_ == Field::Completion) completion = std::move(v);
      if (field_ == Field::InputIds || field_ == Field::Labels || field_ == Field::Messages) wrong_type();
      return true;
    }
    return element_or_skip("a string");
  }
  bool binary(binary_t&) override { return scalar("binary"); }
  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      started_ = true;
    } else if (value_at_top() && field_ != Field::Other) {
      wrong_type();
    } else if (collecting()) {
      not_integer("an object");
    }
    return enter();
  }
  bool key(string_t& k) override {
    if (depth_ != 1) return true;
    field_ = k == "input_ids"    ? Field::InputIds
             : k == "labels"     ? Field::Labels
             : k == "text"       ? Field::Text
             : k == "prompt"     ? Field::Prompt
             : k == "completion" ? Field::Completion
             : k == "messages"   ? Field::Messages
                                 : Field::Other;
    if (field_ != Field::Other) {
      const unsigned bit = 1u << unsigned(field_);
      if (seen_ & bit) input_error(where_, std::string("'") + field_name(field_) + "' is given twice");
      seen_ |= bit;
    }
    return true;
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 0) not_object();
    if (value_at_top()) {
      if (field_ == Field::InputIds || field_ == Field::Labels) {
        (field_ == Field::InputIds ? has_ids : has_labels) = true;
        collect_ = field_;
        index_ = 0;
      } else if (field_ == Field::Messages) {
        has_messages = true;
      } else if (field_ != Field::Other) {
        wrong_type();
      }
    } else if (collecting()) {
      not_integer("an array");
    }
    return enter();
  }
  bool end_array() override {
    if (depth_ == 2) collect_ = Field::None;
    --depth_;
    return true;
  }
  bool parse_error(std::size_t byte, const std::string&, const nlohmann::detail::exception& e) override {
    input_error(where_, "malformed JSON at byte " + std::to_string(byte) + ": " + describe_json_parse_error(e));
  }
  void finish() const {
    if (!started_) not_object();
  }

 private:
  [[noreturn]] void not_object() const { input_error(where_, "each line must be a JSON object"); }
  [[noreturn]] void wrong_type() const {
    const bool ids_field = field_ == Field::InputIds || field_ == Field::Labels;
    input_error(where_, std::string("'") + field_name(field_) + "' must be " +
                            (ids_field                   ? "an array of integers"
                             : field_ == Field::Messages ? "an array of {\"role\", \"content\"} objects"
                                                         : "a string"));
  }
  [[noreturn]] void not_integer(const std::string& what) const {
    input_error(where_, std::string("'") + field_name(collect_) + "'[" + std::to_string(index_) +
                            "] is not an integer (" + what + ")");
  }
  bool value_at_top() const { return depth_ == 1; }
  bool collecting() const { return depth_ == 2 && collect_ != Field::None; }
  bool enter() {
    if (++depth_ > kRecordMaxDepth)
      input_error(where_, "JSON nested deeper than " + std::to_string(kRecordMaxDepth) + " levels");
    return true;
  }
  bool scalar(const char* kind) {
    if (depth_ == 0) not_object();
    if (value_at_top() && field_ != Field::Other) wrong_type();
    return element_or_skip(kind);
  }
  bool element_or_skip(const char* kind) {
    if (depth_ == 0) not_object();
    if (collecting()) not_integer(kind);
    return true;
  }
  bool push(int64_t x, const std::string& text) {
    const bool is_labels = collect_ == Field::Labels;
    if (is_labels && x == kIgnoreIndex) {
      labels.push_back(kIgnoreIndex);
    } else if (x < 0 || x >= vocab_) {
      input_error(where_, std::string("'") + field_name(collect_) + "'[" + std::to_string(index_) + "] = " + text +
                              " is out of range for vocab_size " + std::to_string(vocab_) +
                              (is_labels ? " (use -100 for untrained positions)" : ""));
    } else {
      (is_labels ? labels : ids).push_back(int32_t(x));
    }
    ++index_;
    return true;
  }

  const std::string& where_;
  const int64_t vocab_;
  int depth_ = 0;
  bool started_ = false;
  Field field_ = Field::None, collect_ = Field::None;
  unsigned seen_ = 0;
  size_t index_ = 0;
};

}  // namespace

void set_max_record_bytes(uint64_t bytes) {
  if (bytes < 1 || bytes > kMaxMaxRecordBytes)
    setting_error(Setting::MaxRecordBytes,
                  std::to_string(bytes) + " is out of range [1, " + std::to_string(kMaxMaxRecordBytes) + "]");
  g_max_record_bytes = size_t(bytes);
}

size_t max_record_bytes() { return g_max_record_bytes; }

namespace {

// ---- the tokenized-dataset cache
constexpr char kCacheMagic[8] = {'S', 'F', 'D', 'S', 'E', 'T', 'C', '1'};
// 2: chat records in their key order, turns after their headers, masks by character offsets (issue 16).
// 3: an always-appended generation prompt is not trained; Qwen2.5's and DeepSeek-V3's turns start
//    where TRL's training templates start them.
constexpr uint32_t kCacheVersion = 3;
constexpr size_t kHashWindow = size_t(1) << 20;

uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}
uint64_t hash_bytes(uint64_t h, const void* p, size_t n) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    uint64_t w;
    std::memcpy(&w, c + k, 8);
    h = mix(h, w);
  }
  uint64_t tail = n;
  for (; k < n; ++k) tail = (tail << 8) | c[k];
  return mix(h, tail);
}

// The data file's identity: size, mtime and its first and last MiB. 0 when it cannot be read
// (no cache then).
uint64_t data_key(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  uint64_t h = mix(mix(0x5346444154414b45ull, uint64_t(st.st_size)),
                   uint64_t(st.st_mtim.tv_sec) * 1000000000ull + uint64_t(st.st_mtim.tv_nsec));
  std::string buf(std::min<size_t>(kHashWindow, size_t(st.st_size)), '\0');
  in.read(buf.data(), std::streamsize(buf.size()));
  h = hash_bytes(h, buf.data(), size_t(in.gcount()));
  if (size_t(st.st_size) > kHashWindow) {
    in.clear();
    in.seekg(std::streamoff(st.st_size) - std::streamoff(kHashWindow));
    in.read(buf.data(), std::streamsize(buf.size()));
    h = hash_bytes(h, buf.data(), size_t(in.gcount()));
  }
  return h | 1;
}

struct CacheKey {
  std::string path;  // "" = no cache
  uint64_t key = 0;
};

CacheKey cache_key(const std::string& path, int64_t vocab, const LoadOptions& opt, const Tokenizer* tok,
                   const ChatTemplate* chat, std::time_t now) {
  CacheKey k;
  if (!opt.cache || path == "-") return k;
  const uint64_t d = data_key(path);
  if (d == 0) return k;
  uint64_t h = mix(d, kCacheVersion);
  h = mix(h, uint64_t(vocab));
  h = mix(h, tok ? tok->fingerprint() : 0);
  h = mix(h, chat ? chat->hash : 0);
  h = mix(h, opt.train_on_all);
  if (chat && chat->uses_date) h = mix(h, uint64_t(now / 86400));  // strftime_now("%d %b %Y") changes daily
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  k.path = path + ".sf-cache-" + hex + ".bin";
  k.key = h;
  return k;
}

// Layout: magic[8], version u32, 0 u32, key u64, records u64, total ids u64, then per record its
// length (u64), then all ids (int32), then all labels (int32), then a hash of everything after the
// header (u64).
bool read_cache(const CacheKey& k, int64_t vocab, Dataset& ds) {
  std::ifstream in(k.path, std::ios::binary);
  if (!in) return false;
  auto bad = [&](const char* why) {
    log_info("warning: ignoring the dataset cache %s (%s); it is rebuilt", k.path.c_str(), why);
    return false;
  };
  char magic[8];
  uint32_t ver = 0, zero = 0;
  uint64_t key = 0, n = 0, total = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&ver), 4);
  in.read(reinterpret_cast<char*>(&zero), 4);
  in.read(reinterpret_cast<char*>(&key), 8);
  in.read(reinterpret_cast<char*>(&n), 8);
  in.read(reinterpret_cast<char*>(&total), 8);
  if (!in || std::memcmp(magic, kCacheMagic, 8) != 0) return bad("not a cache file");
  if (ver != kCacheVersion || zero != 0 || key != k.key) return bad("another version or key");
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(k.path, ec);
  if (ec || n == 0 || n > size / 8 || total > size / 8) return bad("bad lengths");
  if (size != 40 + n * 8 + total * 8 + 8) return bad("truncated or padded");
  std::vector<uint64_t> lens(n);
  in.read(reinterpret_cast<char*>(lens.data()), std::streamsize(n * 8));
  uint64_t sum = 0;
  for (uint64_t l : lens) {
    if (l == 0 || l > total) return bad("bad lengths");
    sum += l;
  }
  if (sum != total) return bad("bad lengths");
  std::vector<int32_t> ids(total), labels(total);
  in.read(reinterpret_cast<char*>(ids.data()), std::streamsize(total * 4));
  in.read(reinterpret_cast<char*>(labels.data()), std::streamsize(total * 4));
  uint64_t stored = 0;
  in.read(reinterpret_cast<char*>(&stored), 8);
  if (!in) return bad("truncated");
  uint64_t h = hash_bytes(k.key, lens.data(), n * 8);
  h = hash_bytes(h, ids.data(), total * 4);
  h = hash_bytes(h, labels.data(), total * 4);
  if (h != stored) return bad("checksum mismatch");
  for (uint64_t t = 0; t < total; ++t)
    if (ids[t] < 0 || ids[t] >= vocab || (labels[t] != kIgnoreIndex && (labels[t] < 0 || labels[t] >= vocab)))
      return bad("token ids out of range");
  ds.records.resize(n);
  size_t off = 0;
  for (uint64_t r = 0; r < n; ++r) {
    ds.records[r].ids.assign(ids.begin() + std::ptrdiff_t(off), ids.begin() + std::ptrdiff_t(off + lens[r]));
    ds.records[r].labels.assign(labels.begin() + std::ptrdiff_t(off), labels.begin() + std::ptrdiff_t(off + lens[r]));
    off += lens[r];
  }
  return true;
}

void write_cache(const CacheKey& k, const Dataset& ds) {
  try {
    std::vector<uint64_t> lens;
    uint64_t total = 0;
    for (const Record& r : ds.records) {
      lens.push_back(r.ids.size());
      total += r.ids.size();
    }
    const uint64_t n = lens.size();
    AtomicFile f(k.path);
    f.write(kCacheMagic, 8);
    const uint32_t ver = kCacheVersion, zero = 0;
    f.write(&ver, 4);
    f.write(&zero, 4);
    f.write(&k.key, 8);
    f.write(&n, 8);
    f.write(&total, 8);
    f.write(lens.data(), n * 8);
    uint64_t h = hash_bytes(k.key, lens.data(), n * 8);
    // ids then labels, each hashed as one run (hash_bytes is not streaming: gather them first)
    std::vector<int32_t> all;
    all.reserve(total);
    for (const Record& r : ds.records) all.insert(all.end(), r.ids.begin(), r.ids.end());
    f.write(all.data(), all.size() * 4);
    h = hash_bytes(h, all.data(), all.size() * 4);
    all.clear();
    for (const Record& r : ds.records) all.insert(all.end(), r.labels.begin(), r.labels.end());
    f.write(all.data(), all.size() * 4);
    h = hash_bytes(h, all.data(), all.size() * 4);
    f.write(&h, 8);
    f.commit();
  } catch (const std::exception& e) {
    log_info("warning: the dataset cache was not written: %s", e.what());
  }
}

// The tokenizer and chat template for all the pool's threads: each loaded once, under a lock (the
// callers' loaders are not thread-safe); a load that failed fails the same way for every record.
class SharedModelFiles {
 public:
  SharedModelFiles(const LoadOptions& opt, const Tokenizer* tok, const ChatTemplate* chat, bool chat_loaded)
      : opt_(opt), tok_(tok), chat_(chat), chat_loaded_(chat_loaded) {}

  const Tokenizer& tokenizer(const char* field, const std::string& where) {
    std::lock_guard<std::mutex> lk(mu_);
    if (tok_) return *tok_;
    if (tok_error_) std::rethrow_exception(tok_error_);
    if (!opt_.tokenizer) input_error(where, std::string("'") + field + "' needs a tokenizer (the model has none)");
    try {
      tok_ = &opt_.tokenizer();
    } catch (...) {
      tok_error_ = std::current_exception();
      throw;
    }
    return *tok_;
  }

  const ChatTemplate& chat(const std::string& where) {
    std::lock_guard<std::mutex> lk(mu_);
    if (chat_error_) std::rethrow_exception(chat_error_);
    if (!chat_loaded_) {
      try {
        chat_ = opt_.chat_template ? opt_.chat_template() : nullptr;
      } catch (...) {
        chat_error_ = std::current_exception();
        throw;
      }
      chat_loaded_ = true;
    }
    if (!chat_)
      input_error(
          where, "chat records need the model's chat template (tokenizer_config.json or chat_template.jinja has none)");
    return *chat_;
  }

 private:
  const LoadOptions& opt_;
  std::mutex mu_;
  const Tokenizer* tok_;
  const ChatTemplate* chat_;
  bool chat_loaded_;
  std::exception_ptr tok_error_, chat_error_;
};

// stream_jsonl in its steps: a chunk of lines read in file order, each line made a LoadedRecord on
// the pool (parse, render, encode, label, format), the chunk handed on in order.
class JsonlStream {
 public:
  static constexpr size_t kChunkLines = 1024;
  static constexpr size_t kChunkBytes = size_t(4) << 20;

  JsonlStream(const std::string& path, int64_t vocab, const LoadOptions& opt, const Tokenizer* tok = nullptr,
              const ChatTemplate* chat = nullptr, bool chat_loaded = false)
      : path_(path),
        vocab_(vocab),
        opt_(opt),
        now_(opt.now ? opt.now : std::time(nullptr)),
        files_(opt, tok, chat, chat_loaded) {}

  // Three stages at once: the next chunk is read (a thread of its own) and the previous one handed
  // to `sink` (another) while the pool makes the records of this one; the reading and writing
  // are then off the pool's path (with 16 threads encoding, a serial read and write of each chunk
  // were a tenth of the time).
  void run(const std::function<void(LoadedRecord&)>& format,
           const std::function<void(std::vector<LoadedRecord>&)>& sink) {
    std::unique_ptr<ThreadPool> own_pool;
    if (opt_.threads > 0) own_pool = std::make_unique<ThreadPool>(opt_.threads);
    ThreadPool& pool = own_pool ? *own_pool : cpu_pool();
    LineReader in(path_ == "-" ? "/dev/stdin" : path_, g_max_record_bytes, Setting::MaxRecordBytes);
    Chunk cur, next;
    read_chunk(in, cur);
    std::vector<LoadedRecord> handed;  // the chunk `writer` hands to sink
    std::exception_ptr sink_error;
    std::jthread writer;  // joined before `handed` goes (and on every way out)
    auto join_writer = [&] {
      if (writer.joinable()) writer.join();
      if (sink_error) std::rethrow_exception(sink_error);
    };
    for (;;) {
      std::jthread reader;
      if (cur.more) reader = std::jthread([&] { read_chunk(in, next); });
      std::vector<LoadedRecord> recs(cur.lines.size());
      std::vector<std::exception_ptr> errors(cur.lines.size());
      // Records differ in length: one at a time to whichever thread is free.
      pool.parallel_pieces(
          int64_t(cur.lines.size()),
          [&](int64_t a, int64_t b) {
            for (int64_t i = a; i < b; ++i) {
              try {
                recs[size_t(i)] = record(cur.lines[size_t(i)], cur.line_nos[size_t(i)]);
                if (format) format(recs[size_t(i)]);
              } catch (...) {
                errors[size_t(i)] = std::current_exception();
              }
              std::string().swap(cur.lines[size_t(i)]);
            }
          },
          1);
      if (reader.joinable()) reader.join();
      join_writer();  // the chunk before, in order
      const size_t first_error =
          size_t(std::find_if(errors.begin(), errors.end(), [](const auto& e) { return bool(e); }) - errors.begin());
      recs.resize(first_error);
      const bool last = first_error < errors.size() || cur.read_error || !cur.more;
      if (!recs.empty()) {
        handed = std::move(recs);
        writer = std::jthread([&] {
          try {
            sink(handed);
          } catch (...) {
            sink_error = std::current_exception();
          }
        });
      }
      if (last) {
        join_writer();
        if (first_error < errors.size()) std::rethrow_exception(errors[first_error]);
        if (cur.read_error) std::rethrow_exception(cur.read_error);
        return;
      }
      std::swap(cur, next);
      next = Chunk{};
    }
  }

 private:
  const std::string& path_;
  const int64_t vocab_;
  const LoadOptions& opt_;
  const std::time_t now_;
  SharedModelFiles files_;

  // Up to kChunkLines non-blank lines (kChunkBytes of them) with their line numbers; a read error
  // ends the chunk (thrown after its records), as does the end of the file (more = false).
  struct Chunk {
    std::vector<std::string> lines;
    std::vector<size_t> line_nos;
    std::exception_ptr read_error;
    bool more = true;
  };
  static void read_chunk(LineReader& in, Chunk& c) {
    for (size_t bytes = 0; c.lines.size() < kChunkLines && bytes < kChunkBytes;) {
      std::string line;
      try {
        if (!in.next(line)) {
          c.more = false;
          return;
        }
      } catch (...) {
        c.read_error = std::current_exception();
        c.more = false;
        return;
      }
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
      bytes += line.size();
      c.lines.push_back(std::move(line));
      c.line_nos.push_back(size_t(in.line_number()));
    }
  }

  LoadedRecord record(const std::string& line, size_t line_no) {
    const std::string where = path_ + ":" + std::to_string(line_no);
    check_json_text(where, line.data(), line.data() + line.size());  // NUL, 1e999 (io/json_file.h)
    RecordParser rp(where, vocab_);
    nlohmann::json::sax_parse(line.begin(), line.end(), &rp);
    rp.finish();
    LoadedRecord r;
    r.line = line_no;
    Record& rec = r.record;
    if (rp.has_ids) {
      r.kind = LoadedRecord::Ids;
      rec.ids = std::move(rp.ids);
      if (rec.ids.empty()) input_error(where, "'input_ids' is empty");
      if (rp.has_labels) {
        rec.labels = std::move(rp.labels);
        if (rec.labels.size() != rec.ids.size()) {
          input_error(where, "'labels' has " + std::to_string(rec.labels.size()) + " entries but 'input_ids' has " +
                                 std::to_string(rec.ids.size()));
        }
      } else {
        rec.labels = rec.ids;
      }
      return r;
    }
    if (rp.text) {
      const Tokenizer& tok = files_.tokenizer("text", where);
      r.kind = LoadedRecord::Text;
      rec.ids = tok.encode(*rp.text, opt_.add_special);
      rec.labels = rec.ids;
    } else if (rp.prompt && rp.completion) {
      const Tokenizer& tok = files_.tokenizer("prompt", where);
      r.kind = LoadedRecord::PromptCompletion;
      rec.ids = tok.encode(*rp.prompt, opt_.add_special);
      rec.labels.assign(rec.ids.size(), kIgnoreIndex);
      const std::vector<int32_t> c = tok.encode(*rp.completion, false);
      rec.ids.insert(rec.ids.end(), c.begin(), c.end());
      rec.labels.insert(rec.labels.end(), c.begin(), c.end());
    } else if (rp.has_messages) {
      const Tokenizer& tok = files_.tokenizer("messages", where);
      const ChatTemplate& chat = files_.chat(where);
      r.kind = LoadedRecord::Chat;
      // The SAX pass checked the record; the messages are read in the text's key order.
      ChatRendering rendering = render_chat(chat, chat_messages(line, where), now_, where);
      if (opt_.train_on_all) {
        rec.ids = tok.encode(rendering.text, false);
        rec.labels = rec.ids;
      } else {
        rec = chat_tokens(tok, rendering);  // one encoding: ids and the assistant turns' labels
      }
      if (opt_.keep_chat_text) r.text = std::move(rendering.text);
    } else {
      input_error(where, "needs 'input_ids', 'text', 'prompt' and 'completion', or 'messages'");
    }
    for (int32_t id : rec.ids)
      if (id < 0 || id >= vocab_)
        input_error(where, "token " + std::to_string(id) + " of the tokenizer is outside the model's vocabulary of " +
                               std::to_string(vocab_));
    return r;
  }
};

// load_jsonl: the cache when valid, else the stream's records collected (and cached).
class JsonlLoader {
 public:
  JsonlLoader(const std::string& path, int64_t vocab, const LoadOptions& opt)
      : path_(path), vocab_(vocab), opt_(opt), now_(opt.now ? opt.now : std::time(nullptr)) {}

  Dataset load() {
    Dataset ds;
    ds.path = path_;
    if (opt_.cache && path_ != "-" && read_cached(ds)) return ds;
    bool tokenized = false;
    LoadOptions opt = opt_;
    opt.now = now_;
    JsonlStream(path_, vocab_, opt, tok_, chat_, chat_loaded_).run(nullptr, [&](std::vector<LoadedRecord>& chunk) {
      for (LoadedRecord& r : chunk) {
        if (r.record.ids.empty()) input_error(path_ + ":" + std::to_string(r.line), "the text has no tokens");
        tokenized |= r.kind != LoadedRecord::Ids;
        ds.records.push_back(std::move(r.record));
      }
    });
    if (ds.records.empty()) input_error(path_, "no records");
    // Only tokenized data is cached: token-id records parse as fast as the cache would read.
    if (!ck_.path.empty() && tokenized) write_cache(ck_, ds);
    return ds;
  }

 private:
  const std::string& path_;
  const int64_t vocab_;
  const LoadOptions& opt_;
  const std::time_t now_;
  const Tokenizer* tok_ = nullptr;
  const ChatTemplate* chat_ = nullptr;
  bool chat_loaded_ = false;
  CacheKey ck_;

  // The cache key needs the tokenizer and template; a model without them can still have a cache
  // of token-id records (a missing tokenizer is reported at the first text record).
  bool read_cached(Dataset& ds) {
    try {
      if (opt_.tokenizer) tok_ = &opt_.tokenizer();
    } catch (const InputError&) {
    }
    // A template that cannot be loaded only matters to chat records (reported at the first one).
    try {
      if (opt_.chat_template) {
        chat_ = opt_.chat_template();
        chat_loaded_ = true;
      }
    } catch (const InputError&) {
    }
    ck_ = cache_key(path_, vocab_, opt_, tok_, chat_, now_);
    if (ck_.path.empty() || !read_cache(ck_, vocab_, ds)) return false;
    log_debug("read %zu tokenized records from the cache %s", ds.records.size(), ck_.path.c_str());
    return true;
  }
};

}  // namespace

std::string dataset_cache_path(const std::string& path, int64_t vocab, const LoadOptions& opt) {
  const Tokenizer* tok = nullptr;
  const ChatTemplate* chat = nullptr;
  try {
    if (opt.tokenizer) tok = &opt.tokenizer();
    if (opt.chat_template) chat = opt.chat_template();
  } catch (const InputError&) {
  }
  return cache_key(path, vocab, opt, tok, chat, opt.now ? opt.now : std::time(nullptr)).path;
}

Dataset load_jsonl(const std::string& path, int64_t vocab, const std::function<const Tokenizer&()>& tokenizer) {
  LoadOptions opt;
  opt.tokenizer = tokenizer;
  opt.cache = false;
  return load_jsonl(path, vocab, opt);
}

Dataset load_jsonl(const std::string& path, int64_t vocab, const LoadOptions& opt) {
  return JsonlLoader(path, vocab, opt).load();
}

void stream_jsonl(const std::string& path, int64_t vocab, const LoadOptions& opt,
                  const std::function<void(LoadedRecord&)>& format,
                  const std::function<void(std::vector<LoadedRecord>&)>& sink) {
  JsonlStream(path, vocab, opt).run(format, sink);
}

int64_t trained_targets(const Record& r, int seq_len) {
  size_t n = std::min<size_t>(r.ids.size(), size_t(seq_len));
  int64_t c = 0;
  for (size_t t = 1; t < n; ++t) c += r.labels[t] != kIgnoreIndex;
  return c;
}

Batch make_batch(const std::vector<const Record*>& recs, int seq_len) {
  Batch b;
  b.B = int(recs.size());
  b.T = 1;
  for (const Record* r : recs) b.T = std::max(b.T, int(std::min<size_t>(r->ids.size(), size_t(seq_len))));
  b.ids.assign(size_t(b.B) * b.T, 0);
  b.targets.assign(size_t(b.B) * b.T, kIgnoreIndex);
  for (int i = 0; i < b.B; ++i) {
    const Record& r = *recs[i];
    size_t n = std::min<size_t>(r.ids.size(), size_t(seq_len));
    for (size_t t = 0; t < n; ++t) b.ids[size_t(i) * b.T + t] = r.ids[t];
    for (size_t t = 0; t + 1 < n; ++t) {
      int32_t lab = r.labels[t + 1];
      b.targets[size_t(i) * b.T + t] = lab;
      b.trained += lab != kIgnoreIndex;
    }
  }
  return b;
}

size_t RecordOrder::at(uint64_t i) {
  uint64_t epoch = i / n_;
  size_t pos = size_t(i % n_);
  if (!shuffle_) return pos;
  if (epoch != epoch_) {
    perm_.resize(n_);
    std::iota(perm_.begin(), perm_.end(), size_t(0));
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + epoch + 1);
    for (size_t k = n_ - 1; k > 0; --k) std::swap(perm_[k], perm_[rng() % (k + 1)]);  // Fisher-Yates
    epoch_ = epoch;
  }
  return perm_[pos];
}

}  // namespace sf
