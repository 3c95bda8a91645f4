#include "core/phase_times.h"

#include "core/log.h"

namespace sf {

double PhaseTimes::total() const {
  double s = 0;
  for (const auto& p : phases) s += p.second;
  return s;
}

void PhaseTimes::append(const PhaseTimes& o) { phases.insert(phases.end(), o.phases.begin(), o.phases.end()); }

PhaseClock::PhaseClock(PhaseTimes& out, double log_from_s)
    : out_(out), log_from_s_(log_from_s), t_(std::chrono::steady_clock::now()) {}

double PhaseClock::lap() {
  const auto t = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(t - t_).count();
  t_ = t;
  return s;
}

double PhaseClock::mark(const std::string& name) {
  const double s = lap();
  out_.phases.emplace_back(name, s);
  if (s >= log_from_s_) log_info("set-up: %s %.1f s", name.c_str(), s);
  return s;
}

}  // namespace sf
