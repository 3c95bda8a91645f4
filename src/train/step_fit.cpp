#include "train/step_fit.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/units.h"

namespace sf {

namespace {

// One step shape: sequences per micro-batch, tokens per sequence, micro-batches per step.
struct StepShape {
  int64_t batch = 1, seq = 1, accum = 1;
  double tokens() const { return double(batch) * double(seq) * double(accum); }
  // The token buffers' host bytes (in floating point: no overflow, however absurd the request).
  double buffer_bytes() const {
    return tokens() * double(kStepHostBytesPerToken) + double(accum) * double(kStepHostBytesPerMicroBatch);
  }
};

struct Fit {
  bool fits = false;
  SettingText why;  // when it does not: what it needs and what is available
};

class StepPlanner {
 public:
  StepPlanner(const ModelSpec& spec, const EngineOptions& eo, const EngineRequest& er)
      : spec_(spec), eo_(eo), er_(er), be_(plan_backend(eo, er)) {}

  Fit fit(const StepShape& s) const {
    // The token buffers first, in floating point: an absurd step is refused before the planner's
    // size arithmetic sees it.
    const double tokens_bytes = s.buffer_bytes();
    const size_t budget = host_budget();
    if (tokens_bytes > double(budget))
      return {false,
              {"its token buffers alone need " + format_bytes(size_t(std::min(tokens_bytes, 1e19))) +
                   " of host memory, " + format_bytes(budget) + " available (",
               Setting::HostMemory, ")"}};
    EngineOptions eo = eo_;
    eo.max_batch = int(s.batch);
    eo.max_seq = int(s.seq);
    EngineRequest er = er_;
    er.grad_accum = int(s.accum);
    const Plan p = make_plan(spec_, plan_request(eo, er), be_);
    if (!p.fits) return {false, std::string("the ") + engine_name(p.engine) + " engine " + p.short_of.phrase()};
    const size_t need = p.host_bytes + size_t(tokens_bytes);
    if (need > p.host_budget)
      return {false,
              {"needs " + format_bytes(need) + " of host memory (" + engine_name(p.engine) + " engine " +
                   format_bytes(p.host_bytes) + ", step tokens " + format_bytes(size_t(tokens_bytes)) + "), " +
                   format_bytes(p.host_budget) + " available (",
               Setting::HostMemory, ")"}};
    return {true, {}};
  }

  // The host budget the planner uses (--cpu-memory, else 95 % of MemAvailable).
  size_t host_budget() const {
    if (!budget_) {
      EngineOptions eo = eo_;
      eo.max_batch = 1;
      eo.max_seq = 1;
      EngineRequest er = er_;
      er.grad_accum = 1;
      budget_ = make_plan(spec_, plan_request(eo, er), be_).host_budget;
    }
    return budget_;
  }

 private:
  const ModelSpec& spec_;
  const EngineOptions& eo_;
  const EngineRequest& er_;
  BackendInfo be_;
  mutable size_t budget_ = 0;
};

// The largest v in [lo, hi] with fits(v), given fits(lo) (memory grows with each step dimension).
template <class F>
int64_t largest_fitting(int64_t lo, int64_t hi, F fits) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

[[noreturn]] void refuse(Setting setting, int64_t asked, const StepShape& s, const SettingText& why, int64_t largest) {
  SettingText what = std::to_string(asked) + " (a step of " + std::to_string(s.accum) + " x " +
                     std::to_string(s.batch) + " x " + std::to_string(s.seq) + " tokens) does not fit: ";
  what += why;
  what += {"; at most ", setting, " " + std::to_string(largest) + " fits"};
  setting_error(setting, std::move(what));
}

}  // namespace

void check_step_fits(const ModelSpec& spec, const EngineOptions& eo, const EngineRequest& er) {
  const StepPlanner planner(spec, eo, er);
  const StepShape asked{eo.max_batch, eo.max_seq, er.grad_accum};
  const Fit f = planner.fit(asked);
  if (f.fits) return;
  auto fits = [&](StepShape s) { return planner.fit(s).fits; };
  if (asked.accum > 1 && fits({asked.batch, asked.seq, 1})) {
    const int64_t k = largest_fitting(1, asked.accum - 1, [&](int64_t v) { return fits({asked.batch, asked.seq, v}); });
    refuse(Setting::GradAccum, asked.accum, asked, f.why, k);
  }
  if (asked.batch > 1 && fits({1, asked.seq, 1})) {
    const int64_t b = largest_fitting(1, asked.batch - 1, [&](int64_t v) { return fits({v, asked.seq, 1}); });
    refuse(Setting::BatchSize, asked.batch, asked, f.why, b);
  }
  if (asked.seq > 1 && fits({1, 1, 1})) {
    const int64_t t = largest_fitting(1, asked.seq - 1, [&](int64_t v) { return fits({1, v, 1}); });
    refuse(Setting::SeqLen, asked.seq, asked, f.why, t);
  }
  // Not even one token a step fits: the model itself does not; build_engine says so with the plan.
}

}  // namespace sf
