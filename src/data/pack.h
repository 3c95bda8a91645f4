// Packing (--pack): short records laid end to end in rows of seq_len tokens, so that a batch
// carries few padding tokens. Attention stays inside each record and positions restart at each
// record (Batch::pos, ops.h AttnDims::pos), and no token predicts the next record's first token
// (the target of a record's last token is ignored), so the loss and gradients are those of the
// records run one a row (docs/DECISIONS.md, "Packing").
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace sf {

// Tokens a record occupies in a packed row: its length cut to seq_len (as make_batch cuts).
int packed_length(const Record& r, int seq_len);

// Greedy in order, no look-ahead: a record goes into the current row when it fits, else it
// starts the next row; records longer than seq_len are cut and fill a row alone; empty records
// are skipped. Returns the rows as indices into recs, in order (deterministic: it depends only on
// the lengths and the order).
std::vector<std::vector<size_t>> pack_records(const std::vector<const Record*>& recs, int seq_len);

// The streaming form for training: rows from the records in `order` (RecordOrder positions
// position, position + 1, ...), packed as pack_records does.
class RowPacker {
 public:
  RowPacker(const Dataset& ds, RecordOrder& order, int seq_len, uint64_t position = 0);
  // The records of the next row (at least one, cut lengths summing to <= seq_len).
  std::vector<const Record*> next_row();
  // Records consumed so far (the RecordOrder position of the next record to place): save it in
  // a checkpoint and pass it back to the constructor to resume with the same rows.
  uint64_t position() const { return pos_; }

 private:
  const Dataset& ds_;
  RecordOrder& order_;
  int seq_len_;
  uint64_t pos_;
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
