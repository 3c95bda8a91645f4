// Up-front checks of the options of the commands that read data and train: every hyperparameter
// finite and in range, step sizes bounded, paths within the system's limits. Each problem is an
// InputError naming the option (exit 2), before anything is read or allocated.
#pragma once
#include <cstdint>
#include <string>

#include "train/trainer.h"

namespace sf {

// Fixed bounds of a step's sizes, for the commands that do not train (eval, grad, plan): a step's
// micro-batches are built in host memory and the engine is planned for batch x seq_len, so absurd
// values must stop here, not in an allocation. train and bench bound grad-accum and the step's
// tokens by what the plan can hold instead (train/step_fit.h); batch size and seq-len keep these
// outer bounds there too (a batch is cut to the records anyway; no model has a 4M-token context).
struct StepLimits {
  static constexpr int64_t kMaxBatchSize = 65536;
  static constexpr int64_t kMaxGradAccum = 65536;
  static constexpr int64_t kMaxSeqLen = int64_t(1) << 22;  // 4M tokens, beyond any model's context
  // grad_accum x batch_size x seq_len: token ids and targets of a step in host memory (8 bytes each).
  static constexpr int64_t kMaxStepTokens = int64_t(1) << 28;
};

// A path option: InputError naming `option` when it is longer than PATH_MAX or has a component
// longer than NAME_MAX (the system would refuse it later, with a less clear error).
void check_path_option(const std::string& option, const std::string& path);

// --batch-size, --seq-len (and --grad-accum > 0 only where given), bounded; InputError naming the option.
void check_step_sizes(int64_t batch_size, int64_t seq_len, int64_t grad_accum);
// train and bench: the same for --batch-size and --seq-len, --grad-accum only positive; the step's
// size is then checked against the plan (check_step_fits) once the model's config is read.
void check_step_ranges(int64_t batch_size, int64_t seq_len, int64_t grad_accum);

// eval / grad: --model, --data paths and the step sizes.
void check_data_options(const DataOptions& o);

// train: the data options and every training option (hyperparameters, intervals, paths).
void check_train_options(const TrainOptions& o);

}  // namespace sf
