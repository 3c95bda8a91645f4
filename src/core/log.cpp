#include "core/log.h"

#include <cstdarg>

namespace sf {

Log& log_config() {
  static Log l;
  return l;
}

static void vlog(const char* fmt, va_list ap) {
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

void log_info(const char* fmt, ...) {
  if (log_config().level < LogLevel::Info) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(fmt, ap);
  va_end(ap);
}

void log_debug(const char* fmt, ...) {
  if (log_config().level < LogLevel::Debug) return;
  va_list ap;
  va_start(ap, fmt);
  vlog(fmt, ap);
  va_end(ap);
}

}  // namespace sf
