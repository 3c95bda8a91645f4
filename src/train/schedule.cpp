#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sf {

LrSchedule parse_lr_schedule(const std::string& s) {
  if (s == "constant") return LrSchedule::Constant;
  if (s == "linear") return LrSchedule::Linear;
  if (s == "cosine") return LrSchedule::Cosine;
  input_error("--lr-schedule", "unknown schedule '" + s + "' (expected constant, linear or cosine)");
}

double lr_multiplier(LrSchedule kind, int64_t step, int64_t total, int64_t warmup) {
  if (step < warmup) return double(step) / double(std::max<int64_t>(1, warmup));
  switch (kind) {
    case LrSchedule::Constant:
      return 1.0;
    case LrSchedule::Linear:
      return std::max(0.0, double(total - step) / double(std::max<int64_t>(1, total - warmup)));
    case LrSchedule::Cosine: {
      double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
      return std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return 1.0;
}

}  // namespace sf
