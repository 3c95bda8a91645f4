// Progress and diagnostics go to stderr; stdout is kept for results (the last JSON line).
#pragma once
#include <cstdio>
#include <string>

namespace sf {

enum class LogLevel { Quiet = 0, Info = 1, Debug = 2 };
struct Log {
  LogLevel level = LogLevel::Info;
};
Log& log_config();  // process-wide verbosity, set once by the CLI

void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Progress of long work: "loading weights: 45% (9.1 of 20.0 GB), 12s", at most every 5 s, and a
// last line when the whole took longer than that. Quiet for short work.
class ProgressLog {
 public:
  ProgressLog(std::string what, double total);
  void add(double done);  // units of total
  ~ProgressLog();

 private:
  std::string what_;
  double total_, done_ = 0, t0_, last_;
};

}  // namespace sf
