#include "core/log.h"

#include <chrono>
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

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

ProgressLog::ProgressLog(std::string what, double total) : what_(std::move(what)), total_(total) {
  t0_ = last_ = now_s();
}

void ProgressLog::add(double done) {
  done_ += done;
  const double t = now_s();
  if (t - last_ < 5.0) return;
  last_ = t;
  log_info("%s: %.0f%% (%.1f of %.1f GB), %.0fs", what_.c_str(), total_ > 0 ? 100.0 * done_ / total_ : 100.0,
           done_ * 1e-9, total_ * 1e-9, t - t0_);
}

ProgressLog::~ProgressLog() {
  const double t = now_s();
  if (t - t0_ >= 5.0) log_info("%s: done, %.1f GB in %.0fs", what_.c_str(), done_ * 1e-9, t - t0_);
}

}  // namespace sf
