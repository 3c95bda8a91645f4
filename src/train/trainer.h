// The commands' work: evaluation, gradients, training (through an Engine: resident or sliding).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

#include "engine/make_engine.h"

namespace sf {

struct DataOptions {
  std::string model_dir;
  std::string data;
  std::string device = "auto";
  int seq_len = 0;            // 0: the longest record (capped at max_position_embeddings when set)
  int batch_size = 8;         // sequences per micro-batch
  std::string compute_dtype;  // "" (device default), "fp32" (cpu only) or "bf16"
  // --max-record-bytes: the longest JSONL line read, a size ("" = the default).
  std::string max_record_bytes;
  // Chat records: "assistant" (labels only on the assistant turns) or "all" (--train-on).
  std::string train_on = "assistant";
  bool data_cache = true;  // --no-data-cache: no tokenized-dataset cache next to the data
  // --pack: records laid end to end in rows of seq_len tokens (data/pack.h); attention and
  // positions stay inside each record, so the loss is that of the records run one a row.
  bool pack = false;
  // --no-verify: skip the checksums (tensors, manifest) and the finite-value check of the model
  // and checkpoint read (about a second per 10 GB; the log says it was skipped).
  bool verify = true;
  // Engine choice and memory budgets (the planner's input; its device field is set from `device`).
  EngineRequest engine;
};

struct EvalResult {
  double loss = 0;
  int64_t tokens = 0;
  std::string engine;  // the engine that ran: "resident" or "sliding" (the plan's; parity runs check it)
};

EvalResult run_eval(const DataOptions& o);
// Writes the fp32 gradient of the eval loss for every parameter to out_path (safetensors).
EvalResult run_grad(const DataOptions& o, const std::string& out_path);

struct TrainOptions {
  DataOptions data;
  std::string output;
  int64_t steps = 0;
  double lr = 0;
  int grad_accum = 1;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t warmup_steps = 0;
  std::string lr_schedule = "constant";
  double max_grad_norm = 0.0;  // 0 = no clipping
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t save_every = 0;  // 0 = only at the end; checkpoints carry the exact training state
  std::string resume;      // a checkpoint-<step> directory to continue from
  int64_t log_every = 1;   // progress line every K steps when stderr is not a terminal (0 = none)
  std::string metrics;     // --metrics FILE.jsonl: one JSON record per optimizer step and per evaluation
  std::string eval_data;   // held-out JSONL: its loss after the last step (and every eval_every)
  int64_t eval_every = 0;
  size_t max_shard_bytes = 5'000'000'000;
};

struct TrainResult {
  double first_loss = 0, last_loss = 0;
  int64_t steps = 0;
  double tokens_per_second = 0;
  double eval_loss = std::nan("");  // after the last step, when eval_data is given
  // SIGINT / SIGTERM during training: the run stopped after a whole step and saved
  // OUTPUT/checkpoint-<steps> (resumable); the signal number, else 0.
  int interrupted_by = 0;
  std::string checkpoint;
};

TrainResult run_train(const TrainOptions& o);

}  // namespace sf
