#include "data/pack.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

int packed_length(const Record& r, int seq_len) { return int(std::min<size_t>(r.ids.size(), size_t(seq_len))); }

std::vector<std::vector<size_t>> pack_records(const std::vector<const Record*>& recs, int seq_len) {
  SF_CHECK(seq_len > 0, "pack_records: seq_len must be positive");
  std::vector<std::vector<size_t>> rows;
  int used = seq_len;  // tokens in the last row (seq_len: no open row)
  for (size_t i = 0; i < recs.size(); ++i) {
    const int n = packed_length(*recs[i], seq_len);
    if (n == 0) continue;
    if (used + n > seq_len) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(i);
    used += n;
  }
  return rows;
}

RowPacker::RowPacker(const Dataset& ds, RecordOrder& order, int seq_len, uint64_t position)
    : ds_(ds), order_(order), seq_len_(seq_len), pos_(position) {
  SF_CHECK(seq_len > 0, "RowPacker: seq_len must be positive");
  SF_CHECK(std::any_of(ds.records.begin(), ds.records.end(), [](const Record& r) { return !r.ids.empty(); }),
           "RowPacker: every record is empty");
}

std::vector<const Record*> RowPacker::next_row() {
  std::vector<const Record*> row;
  int used = 0;
  for (;;) {
    const Record& r = ds_.records[order_.at(pos_)];
    const int n = packed_length(r, seq_len_);
    if (n == 0) {  // skipped
      ++pos_;
      continue;
    }
    if (!row.empty() && used + n > seq_len_) return row;  // starts the next row
    row.push_back(&r);
    used += n;
    ++pos_;
    if (used == seq_len_) return row;
  }
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
