// Seconds of the named phases of a long piece of work (an engine's set-up: planning, allocation
// and first touch of host state, weights), in the order they ran.
#pragma once
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace sf {

struct PhaseTimes {
  std::vector<std::pair<std::string, double>> phases;  // (name, seconds)
  double total() const;
  void append(const PhaseTimes& o);
};

// Times phases one after the other: each mark(name) records the seconds since the previous mark
// (or construction) as phase `name` and, when that phase took at least `log_from_s`, logs
// "set-up: NAME 12.3 s" (stderr, like the other progress lines), so a long set-up shows where it is.
class PhaseClock {
 public:
  explicit PhaseClock(PhaseTimes& out, double log_from_s = 1.0);
  double mark(const std::string& name);  // the phase's seconds
  double lap();  // seconds since the previous mark or lap, recording nothing (the next phase starts now)

 private:
  PhaseTimes& out_;
  double log_from_s_;
  std::chrono::steady_clock::time_point t_;
};

}  // namespace sf
