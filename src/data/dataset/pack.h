// Packing (--pack): short records laid end to end in rows of seq_len tokens, so that a batch
// carries few padding tokens. Attention stays inside each record and positions restart at each
// record (Batch::pos, ops.h AttnDims::pos), and no token predicts the next record's first token
// (the target of a record's last token is ignored), so the loss and gradients are those of the
// records run one a row (docs/DECISIONS.md, "Packing").
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataset/dataset.h"

namespace sf {

// Tokens a record occupies in a packed row: its length cut to seq_len (as make_batch cuts).
int packed_length(const Record& r, int seq_len);

// The packer works on windows of consecutive records (in data order): a window ends when its
// records hold kPackWindowRows rows' worth of tokens, at kPackWindowRecords records, or at the end
// of an epoch, so a record is packed with its neighbours in the order and every epoch holds each
// record once. Inside a window: best fit decreasing (longest record first, each into the open row
// with the least room that holds it, else a new row), which fills ~98 % of the slots on a 50-800
// token mix at seq_len 2048 where a greedy in-order packer fills ~86 %; only the window's last rows
// are left part-full. Rows come out in the order of their earliest record; inside a row the
// records keep their order. Records longer than seq_len are cut and fill a row alone; empty
// records are skipped. Deterministic: the rows depend only on the lengths and the order.
constexpr int64_t kPackWindowRows = 64;
constexpr size_t kPackWindowRecords = 8192;

// Rows of one window: `lens` are the packed lengths of the window's records; returns the rows as
// indices into lens.
std::vector<std::vector<size_t>> pack_window(const std::vector<int>& lens, int seq_len);

// A whole list of records (eval, grad), windows from its start: the rows as indices into recs.
std::vector<std::vector<size_t>> pack_records(const std::vector<const Record*>& recs, int seq_len);

// The streaming form for training: rows from the records in `order` (RecordOrder positions),
// windows from position `window_start`, the first `rows_taken` rows of that window already used.
class RowPacker {
 public:
  RowPacker(const Dataset& ds, RecordOrder& order, int seq_len, uint64_t window_start = 0, uint64_t rows_taken = 0);
  // The records of the next row (at least one, cut lengths summing to <= seq_len).
  std::vector<const Record*> next_row();
  // Where the packer stands: the RecordOrder position of the current window's first record and the
  // rows of it used so far. Save both in a checkpoint and pass them back to the constructor to
  // resume with the same rows.
  uint64_t window_start() const { return start_; }
  uint64_t rows_taken() const { return next_; }

 private:
  void load_window(uint64_t start);

  const Dataset& ds_;
  RecordOrder& order_;
  int seq_len_;
  uint64_t start_ = 0, end_ = 0;           // the window's RecordOrder positions [start_, end_)
  std::vector<std::vector<size_t>> rows_;  // the window's rows, as record indices into ds_.records
  uint64_t next_ = 0;                      // rows_ used so far
};

// One micro-batch of B = rows.size() packed rows, T = the longest row (<= seq_len), padded with id
// 0 and target -100. ids/targets as make_batch per record (targets[t] = labels[t+1] inside the
// record, -100 at its last token); pos [B*T] = each token's position in its record (the padding
// after the last record counts as one more record). trained = the sum of trained_targets.
Batch make_packed_batch(const std::vector<std::vector<const Record*>>& rows, int seq_len);

// A whole file packed (eval, grad): the rows of pack_records(recs, seq_len), B rows a batch (the
// last batch may have fewer), each made by make_packed_batch.
std::vector<Batch> make_packed_batches(const std::vector<const Record*>& recs, int seq_len, int B);

}  // namespace sf
