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

}  // namespace sf
