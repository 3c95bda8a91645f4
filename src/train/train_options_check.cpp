#include "train/train_options_check.h"

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

#include "core/error.h"
#include "data/tokenizer/unicode.h"

namespace sf {

namespace {

// The shortest text that reads back as x ("1e-30", not "1.0000000000000001e-30").
std::string num(double x) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

// A finite number in [lo, hi] (or [lo, hi) with hi_open); NaN fails every comparison, so the test
// is written to accept, not to reject.
void check_real(const char* option, double x, double lo, double hi, bool lo_open, bool hi_open) {
  const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  if (!ok)
    input_error(option, num(x) + " is out of range " + (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) +
                            (hi_open ? ")" : "]"));
}

void check_int(const char* option, int64_t x, int64_t lo, int64_t hi) {
  if (x < lo || x > hi)
    input_error(option,
                std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

void check_path_option(const std::string& option, const std::string& path) {
  // Paths are recorded in JSON (the result line, trainer_state.json), which holds only UTF-8 text.
  if (!uni::valid_utf8(path))
    input_error(option, "the path is not valid UTF-8; rename it (slideformer records paths in JSON files)");
  if (path.size() >= size_t(PATH_MAX))
    input_error(option, "the path is " + std::to_string(path.size()) + " bytes, longer than the system's limit of " +
                            std::to_string(PATH_MAX - 1) + " (PATH_MAX): '" + path.substr(0, 80) + "...'");
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    if (end - begin > size_t(NAME_MAX))
      input_error(option, "a path component is " + std::to_string(end - begin) +
                              " bytes, longer than the system's limit of " + std::to_string(NAME_MAX) +
                              " (NAME_MAX): '" + path.substr(begin, 80) + "...'");
    begin = end + 1;
  }
}

void check_step_sizes(int64_t batch_size, int64_t seq_len, int64_t grad_accum) {
  check_int("--batch-size", batch_size, 1, StepLimits::kMaxBatchSize);
  check_int("--seq-len", seq_len, 0, StepLimits::kMaxSeqLen);  // 0: the longest record
  check_int("--grad-accum", grad_accum, 1, StepLimits::kMaxGradAccum);
  // Each factor is bounded above, so the product cannot overflow.
  if (seq_len > 0 && batch_size * seq_len * grad_accum > StepLimits::kMaxStepTokens)
    input_error("--grad-accum/--batch-size/--seq-len",
                std::to_string(grad_accum) + " x " + std::to_string(batch_size) + " x " + std::to_string(seq_len) +
                    " tokens per step is more than the limit of " + std::to_string(StepLimits::kMaxStepTokens));
}

void check_step_ranges(int64_t batch_size, int64_t seq_len, int64_t grad_accum) {
  check_int("--batch-size", batch_size, 1, StepLimits::kMaxBatchSize);
  check_int("--seq-len", seq_len, 0, StepLimits::kMaxSeqLen);  // 0: the longest record
  check_int("--grad-accum", grad_accum, 1, std::numeric_limits<int>::max());
}

void check_data_options(const DataOptions& o) {
  check_path_option("--model", o.model_dir);
  check_path_option("--data", o.data);
  check_step_sizes(o.batch_size, o.seq_len, 1);
}

void check_train_options(const TrainOptions& o) {
  check_path_option("--model", o.data.model_dir);
  check_path_option("--data", o.data.data);
  check_path_option("--output", o.output);
  if (!o.resume.empty()) check_path_option("--resume", o.resume);
  if (!o.eval_data.empty()) check_path_option("--eval-data", o.eval_data);
  if (!o.metrics.empty()) check_path_option("--metrics", o.metrics);
  check_step_ranges(o.data.batch_size, o.data.seq_len, o.grad_accum);  // then check_step_fits

  constexpr int64_t kMaxSteps = int64_t(1) << 40;
  check_int("--steps", o.steps, 1, kMaxSteps);
  check_int("--warmup-steps", o.warmup_steps, 0, kMaxSteps);
  check_int("--save-every", o.save_every, 0, kMaxSteps);
  check_int("--eval-every", o.eval_every, 0, kMaxSteps);
  check_int("--log-every", o.log_every, 0, kMaxSteps);
  // Ranges where AdamW means something: a larger learning rate or decay only produces NaN weights.
  check_real("--lr", o.lr, 0, 1e3, false, false);
  // The optimizer runs in single precision: eps must not round to 0 there, nor a beta to 1
  // (1 - beta^t would then divide by zero).
  check_real("--eps", o.eps, 1e-30, 1, false, false);
  check_real("--weight-decay", o.weight_decay, 0, 1e3, false, false);
  check_real("--beta1", o.beta1, 0, 1, false, true);
  check_real("--beta2", o.beta2, 0, 1, false, true);
  for (const auto& [option, beta] : {std::pair<const char*, double>{"--beta1", o.beta1}, {"--beta2", o.beta2}})
    if (float(beta) >= 1.f) input_error(option, num(beta) + " rounds to 1 in single precision; use a smaller value");
  check_real("--max-grad-norm", o.max_grad_norm, 0, 1e30, false, false);
  if (o.output.empty()) input_error("--output", "is required");
  if (o.eval_every > 0 && o.eval_data.empty()) input_error("--eval-every", "needs --eval-data");
}

}  // namespace sf
