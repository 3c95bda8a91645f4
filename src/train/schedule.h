// Learning-rate schedules, as Hugging Face's get_{constant,linear,cosine}_schedule_with_warmup:
// the multiplier for 0-based optimizer step `step` (so with warmup the first step has lr 0).
#pragma once
#include <cstdint>
#include <string>

namespace sf {

enum class LrSchedule { Constant, Linear, Cosine };

LrSchedule parse_lr_schedule(const std::string& s);  // InputError on an unknown name
double lr_multiplier(LrSchedule kind, int64_t step, int64_t total_steps, int64_t warmup_steps);

}  // namespace sf
