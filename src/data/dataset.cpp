#include "data/dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "core/error.h"
#include "data/tokenizer.h"

namespace sf {
namespace {

std::vector<int32_t> read_ids(const nlohmann::json& j, const char* key, int64_t vocab, bool allow_ignore,
                              const std::string& where) {
  if (!j.is_array()) input_error(where, std::string("'") + key + "' must be an array of integers");
  std::vector<int32_t> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    if (!v.is_number_integer()) {
      input_error(where, std::string("'") + key + "'[" + std::to_string(i) + "] is not an integer");
    }
    int64_t x = v.get<int64_t>();
    if (allow_ignore && x == kIgnoreIndex) {
      out.push_back(kIgnoreIndex);
      continue;
    }
    if (x < 0 || x >= vocab) {
      input_error(where, std::string("'") + key + "'[" + std::to_string(i) + "] = " + std::to_string(x) +
                             " is out of range for vocab_size " + std::to_string(vocab) +
                             (allow_ignore ? " (use -100 for untrained positions)" : ""));
    }
    out.push_back(int32_t(x));
  }
  return out;
}

}  // namespace

Dataset load_jsonl(const std::string& path, int64_t vocab, const std::function<const Tokenizer&()>& tokenizer) {
  const Tokenizer* tok = nullptr;
  auto encode = [&](const nlohmann::json& v, const char* field, bool special, const std::string& where) {
    if (!v.is_string()) input_error(where, std::string("'") + field + "' must be a string");
    if (!tok) {
      if (!tokenizer) input_error(where, std::string("'") + field + "' needs a tokenizer (the model has none)");
      tok = &tokenizer();
    }
    std::vector<int32_t> ids = tok->encode(v.get<std::string>(), special);
    for (int32_t id : ids)
      if (id >= vocab)
        input_error(where, "token " + std::to_string(id) + " of the tokenizer is outside the model's vocabulary of " +
                               std::to_string(vocab));
    return ids;
  };
  std::ifstream in(path);
  if (!in) input_error(path, "cannot open data file");
  Dataset ds;
  ds.path = path;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    std::string where = path + ":" + std::to_string(lineno);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      input_error(where, std::string("malformed JSON: ") + e.what());
    }
    if (!j.is_object()) input_error(where, "each line must be a JSON object");
    Record r;
    if (!j.contains("input_ids")) {
      if (j.contains("text")) {
        r.ids = encode(j["text"], "text", true, where);
        r.labels = r.ids;
      } else if (j.contains("prompt") && j.contains("completion")) {
        r.ids = encode(j["prompt"], "prompt", true, where);
        r.labels.assign(r.ids.size(), kIgnoreIndex);
        const std::vector<int32_t> c = encode(j["completion"], "completion", false, where);
        r.ids.insert(r.ids.end(), c.begin(), c.end());
        r.labels.insert(r.labels.end(), c.begin(), c.end());
      } else {
        input_error(where, "needs 'input_ids', 'text', or 'prompt' and 'completion'");
      }
      if (r.ids.empty()) input_error(where, "the text has no tokens");
      ds.records.push_back(std::move(r));
      continue;
    }
    r.ids = read_ids(j["input_ids"], "input_ids", vocab, false, where);
    if (r.ids.empty()) input_error(where, "'input_ids' is empty");
    if (j.contains("labels") && !j["labels"].is_null()) {
      r.labels = read_ids(j["labels"], "labels", vocab, true, where);
      if (r.labels.size() != r.ids.size()) {
        input_error(where, "'labels' has " + std::to_string(r.labels.size()) + " entries but 'input_ids' has " +
                               std::to_string(r.ids.size()));
      }
    } else {
      r.labels = r.ids;
    }
    ds.records.push_back(std::move(r));
  }
  if (in.bad()) input_error(path, "read error");
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
