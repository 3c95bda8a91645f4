#include "data/dataset.h"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "core/error.h"
#include "data/tokenizer.h"
#include "io/json_file.h"
#include "io/line_reader.h"

namespace sf {
namespace {

size_t g_max_record_bytes = kDefaultMaxRecordBytes;

// A record's nesting limit (records are 2 deep; unknown keys may hold more, but not without bound).
constexpr int kRecordMaxDepth = 64;

enum class Field { None, InputIds, Labels, Text, Prompt, Completion, Other };

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
  bool has_ids = false, has_labels = false;
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
      if (field_ == Field::InputIds || field_ == Field::Labels) wrong_type();
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
                            (ids_field ? "an array of integers" : "a string"));
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
    input_error("--max-record-bytes",
                std::to_string(bytes) + " is out of range [1, " + std::to_string(kMaxMaxRecordBytes) + "]");
  g_max_record_bytes = size_t(bytes);
}

size_t max_record_bytes() { return g_max_record_bytes; }

Dataset load_jsonl(const std::string& path, int64_t vocab, const std::function<const Tokenizer&()>& tokenizer) {
  const Tokenizer* tok = nullptr;
  auto encode = [&](const std::string& v, const char* field, bool special, const std::string& where) {
    if (!tok) {
      if (!tokenizer) input_error(where, std::string("'") + field + "' needs a tokenizer (the model has none)");
      tok = &tokenizer();
    }
    std::vector<int32_t> ids = tok->encode(v, special);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab)
        input_error(where, "token " + std::to_string(id) + " of the tokenizer is outside the model's vocabulary of " +
                               std::to_string(vocab));
    return ids;
  };
  LineReader in(path, g_max_record_bytes, "raise it with --max-record-bytes");
  Dataset ds;
  ds.path = path;
  std::string line;
  while (in.next(line)) {
    const std::string where = path + ":" + std::to_string(in.line_number());
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
    RecordParser rp(where, vocab);
    nlohmann::json::sax_parse(line.begin(), line.end(), &rp);
    rp.finish();
    Record r;
    if (!rp.has_ids) {
      if (rp.text) {
        r.ids = encode(*rp.text, "text", true, where);
        r.labels = r.ids;
      } else if (rp.prompt && rp.completion) {
        r.ids = encode(*rp.prompt, "prompt", true, where);
        r.labels.assign(r.ids.size(), kIgnoreIndex);
        const std::vector<int32_t> c = encode(*rp.completion, "completion", false, where);
        r.ids.insert(r.ids.end(), c.begin(), c.end());
        r.labels.insert(r.labels.end(), c.begin(), c.end());
      } else {
        input_error(where, "needs 'input_ids', 'text', or 'prompt' and 'completion'");
      }
      if (r.ids.empty()) input_error(where, "the text has no tokens");
      ds.records.push_back(std::move(r));
      continue;
    }
    r.ids = std::move(rp.ids);
    if (r.ids.empty()) input_error(where, "'input_ids' is empty");
    if (rp.has_labels) {
      r.labels = std::move(rp.labels);
      if (r.labels.size() != r.ids.size()) {
        input_error(where, "'labels' has " + std::to_string(r.labels.size()) + " entries but 'input_ids' has " +
                               std::to_string(r.ids.size()));
      }
    } else {
      r.labels = r.ids;
    }
    ds.records.push_back(std::move(r));
  }
  if (ds.records.empty()) input_error(path, "no records");
  return ds;
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
