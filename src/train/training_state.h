// The exact training state saved beside a checkpoint's HF files (OUTPUT/checkpoint-STEP) and
// restored by --resume: fp32 masters and AdamW moments in training_state.safetensors (the HF
// weights may be rounded to bf16), and where the data order and the schedule stand in
// trainer_state.json.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/engine.h"
#include "model/spec.h"
#include "train/trainer.h"

namespace sf {

// Where a run is: the optimizer step about to run and the next record position (--pack: the
// packer's window start and the rows of that window already used).
struct TrainProgress {
  int64_t step = 0;
  uint64_t next_record = 0;
  uint64_t pack_rows = 0;
};

// Writes both files into `dir` (a staged checkpoint directory); `records` and `seq_len` are the
// run's data shape, saved so that a resume can check it continues the same run.
void write_training_state(Engine& engine, const ModelSpec& spec, const TrainOptions& o, size_t records, int seq_len,
                          const TrainProgress& p, const std::string& dir);

// Restores what write_training_state wrote into `engine`, after checking that the run continues
// the same way (records, batch size, grad-accum, shuffle, seed) and that every tensor is there
// with its checksum, dtype and shape; any defect is an InputError naming the file.
TrainProgress read_training_state(Engine& engine, const ModelSpec& spec, const TrainOptions& o, size_t records,
                                  const std::string& dir);

}  // namespace sf
