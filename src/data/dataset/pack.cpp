#include "data/dataset/pack.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace sf {

int packed_length(const Record& r, int seq_len) { return int(std::min<size_t>(r.ids.size(), size_t(seq_len))); }

namespace {

// Whether a window that holds `tokens` tokens in `records` records is full.
bool window_full(int64_t tokens, size_t records, int seq_len) {
  return tokens >= kPackWindowRows * seq_len || records >= kPackWindowRecords;
}

// The packed lengths of one window: of the `available` records left, at(0), at(1), ... (each asked
// once, in order) until the window is full.
std::vector<int> window_lengths(uint64_t available, int seq_len, const std::function<const Record&(size_t)>& at) {
  std::vector<int> lens;
  for (int64_t tokens = 0; lens.size() < available && !window_full(tokens, lens.size(), seq_len); tokens += lens.back())
    lens.push_back(packed_length(at(lens.size()), seq_len));
  return lens;
}

}  // namespace

std::vector<std::vector<size_t>> pack_window(const std::vector<int>& lens, int seq_len) {
  SF_CHECK(seq_len > 0, "pack_window: seq_len must be positive");
  std::vector<size_t> by_length;  // non-empty records, longest first (ties: earlier first)
  for (size_t i = 0; i < lens.size(); ++i)
    if (lens[i] > 0) by_length.push_back(i);
  std::stable_sort(by_length.begin(), by_length.end(), [&](size_t a, size_t b) { return lens[a] > lens[b]; });
  std::vector<std::vector<size_t>> rows;
  std::vector<int> room;  // [rows] free tokens of each row
  for (size_t i : by_length) {
    const int n = std::min(lens[i], seq_len);
    size_t best = rows.size();
    for (size_t r = 0; r < rows.size(); ++r)
      if (room[r] >= n && (best == rows.size() || room[r] < room[best])) best = r;
    if (best == rows.size()) {
      rows.emplace_back();
      room.push_back(seq_len);
    }
    rows[best].push_back(i);
    room[best] -= n;
  }
  for (auto& row : rows) std::sort(row.begin(), row.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return rows;
}

std::vector<std::vector<size_t>> pack_records(const std::vector<const Record*>& recs, int seq_len) {
  SF_CHECK(seq_len > 0, "pack_records: seq_len must be positive");
  std::vector<std::vector<size_t>> rows;
  for (size_t first = 0; first < recs.size();) {
    const std::vector<int> lens =
        window_lengths(recs.size() - first, seq_len, [&](size_t i) -> const Record& { return *recs[first + i]; });
    for (auto& row : pack_window(lens, seq_len)) {
      for (size_t& k : row) k += first;
      rows.push_back(std::move(row));
    }
    first += lens.size();
  }
  return rows;
}

RowPacker::RowPacker(const Dataset& ds, RecordOrder& order, int seq_len, uint64_t window_start, uint64_t rows_taken)
    : ds_(ds), order_(order), seq_len_(seq_len) {
  SF_CHECK(seq_len > 0, "RowPacker: seq_len must be positive");
  SF_CHECK(std::any_of(ds.records.begin(), ds.records.end(), [](const Record& r) { return !r.ids.empty(); }),
           "RowPacker: every record is empty");
  load_window(window_start);
  if (rows_taken > rows_.size())
    setting_error(Setting::Resume,
                  {"the checkpoint's packing position (row " + std::to_string(rows_taken) + " of a window of " +
                       std::to_string(rows_.size()) + ") does not fit this data and ",
                   Setting::SeqLen});
  next_ = rows_taken;
}

void RowPacker::load_window(uint64_t start) {
  const uint64_t n = ds_.records.size();
  const uint64_t epoch_end = (start / n + 1) * n;
  std::vector<size_t> idx;  // record indices of the window's positions
  const std::vector<int> lens = window_lengths(epoch_end - start, seq_len_, [&](size_t i) -> const Record& {
    idx.push_back(order_.at(start + i));
    return ds_.records[idx.back()];
  });
  rows_ = pack_window(lens, seq_len_);
  for (auto& row : rows_)
    for (size_t& k : row) k = idx[k];
  start_ = start;
  end_ = start + idx.size();
  next_ = 0;
}

std::vector<const Record*> RowPacker::next_row() {
  while (next_ == rows_.size()) load_window(end_);  // a window of empty records has no rows
  std::vector<const Record*> row;
  for (size_t k : rows_[next_]) row.push_back(&ds_.records[k]);
  ++next_;
  return row;
}

Batch make_packed_batch(const std::vector<std::vector<const Record*>>& rows, int seq_len) {
  SF_CHECK(!rows.empty() && seq_len > 0, "make_packed_batch: no rows");
  Batch b;
  b.B = int(rows.size());
  b.T = 1;
  for (const auto& row : rows) {
    int n = 0;
    for (const Record* r : row) n += packed_length(*r, seq_len);
    SF_CHECK(n <= seq_len, "make_packed_batch: a row holds more than seq_len tokens");
    b.T = std::max(b.T, n);
  }
  const size_t N = size_t(b.B) * size_t(b.T);
  b.ids.assign(N, 0);                 // [B*T]
  b.targets.assign(N, kIgnoreIndex);  // [B*T]
  b.pos.assign(N, 0);                 // [B*T]
  for (int i = 0; i < b.B; ++i) {
    const size_t row0 = size_t(i) * size_t(b.T);
    size_t at = 0;  // next free token of the row
    for (const Record* r : rows[size_t(i)]) {
      const size_t n = size_t(packed_length(*r, seq_len));
      for (size_t t = 0; t < n; ++t) {
        b.ids[row0 + at + t] = r->ids[t];
        b.pos[row0 + at + t] = int32_t(t);
      }
      for (size_t t = 0; t + 1 < n; ++t) {  // the last token's target stays -100
        const int32_t lab = r->labels[t + 1];
        b.targets[row0 + at + t] = lab;
        b.trained += lab != kIgnoreIndex;
      }
      at += n;
    }
    for (size_t t = at; t < size_t(b.T); ++t) b.pos[row0 + t] = int32_t(t - at);  // padding: a record of its own
  }
  return b;
}

std::vector<Batch> make_packed_batches(const std::vector<const Record*>& recs, int seq_len, int B) {
  SF_CHECK(B > 0, "make_packed_batches: B must be positive");
  const std::vector<std::vector<size_t>> rows = pack_records(recs, seq_len);
  std::vector<Batch> out;
  for (size_t i = 0; i < rows.size(); i += size_t(B)) {
    std::vector<std::vector<const Record*>> group;
    for (size_t r = i; r < std::min(rows.size(), i + size_t(B)); ++r) {
      group.emplace_back();
      for (size_t k : rows[r]) group.back().push_back(recs[k]);
    }
    out.push_back(make_packed_batch(group, seq_len));
  }
  return out;
}

}  // namespace sf
