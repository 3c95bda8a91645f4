#include "train/progress.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "core/error.h"
#include "core/log.h"
#include "core/units.h"

namespace sf {

std::string format_step(const StepReport& r) {
  char buf[320];
  std::snprintf(buf, sizeof buf, "step %lld/%lld loss %.6f lr %.3e grad_norm %.4f tok/s %.0f elapsed %s eta %s",
                (long long)r.step, (long long)r.total, r.loss, r.lr, r.grad_norm, r.tokens_per_s,
                format_duration(r.elapsed_s).c_str(), format_duration(r.eta_s).c_str());
  std::string s = buf;
  if (r.gpu_bytes > 0) s += " gpu " + format_bytes(r.gpu_bytes);
  if (r.rss_bytes > 0) s += " rss " + format_bytes(r.rss_bytes);
  return s;
}

size_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? size_t(resident) * size_t(::sysconf(_SC_PAGESIZE)) : 0;
}

ProgressDisplay::ProgressDisplay(std::FILE* out, bool tty, int64_t log_every)
    : out_(out), tty_(tty), log_every_(log_every) {}

ProgressDisplay::~ProgressDisplay() { break_line(); }

bool ProgressDisplay::stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

void ProgressDisplay::step(const StepReport& r) {
  if (log_config().level < LogLevel::Info || log_every_ <= 0) return;
  if (tty_) {
    // One line in place: back to its start, the new text, then erase what a longer line left.
    std::fprintf(out_, "\r%s\x1b[K", format_step(r).c_str());
    pending_ = true;
    if (r.step == r.total) break_line();
  } else if (r.step % log_every_ == 0 || r.step == 1 || r.step == r.total) {
    std::fprintf(out_, "%s\n", format_step(r).c_str());
  }
  std::fflush(out_);
}

void ProgressDisplay::break_line() {
  if (!pending_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  pending_ = false;
}

void check_metrics_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return;  // a new file
  const std::string refuse = "; refusing to overwrite it (choose a new file name)";
  if (!S_ISREG(st.st_mode)) input_error("--metrics", path + ": exists and is not a regular file" + refuse);
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error("--metrics", path + ": cannot read: " + std::strerror(errno));
  std::string line;
  int64_t n = 0, records = 0;
  while (std::getline(in, line)) {
    ++n;
    const bool cut = in.eof();  // the last line, without its newline
    if (line.empty()) continue;
    bool ours = false;
    if (line.size() < 4096 && line.find('\0') == std::string::npos) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const auto type = j.is_object() ? j.find("type") : j.end();
      ours = j.is_object() && type != j.end() && (*type == "train" || *type == "eval") && j.contains("step") &&
             j["step"].is_number_integer();
    }
    records += ours;
    if (!ours && !(cut && records > 0))  // after records of ours, a last line may be cut short (a full disk)
      input_error("--metrics", path + ": exists and line " + std::to_string(n) +
                                   " is not a slideformer metrics record" + refuse);
  }
}

MetricsFile::MetricsFile(const std::string& path, bool append) : path_(path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_APPEND | (append ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) input_error("--metrics", path + ": cannot open for writing: " + std::strerror(errno));
}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsFile::write_line(const nlohmann::json& j) {
  if (fd_ < 0) return;
  // The whole line in one write (O_APPEND): a crash between records never leaves half a line. The
  // dump replaces invalid UTF-8 rather than throwing (records hold only numbers and ASCII anyway).
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) input_error("--metrics", path_ + ": write failed: " + std::strerror(n < 0 ? errno : ENOSPC));
    done += size_t(n);
  }
}

void MetricsFile::train_step(const StepReport& r) {
  write_line({{"type", "train"},
              {"step", r.step},
              {"loss", r.loss},
              {"lr", r.lr},
              {"grad_norm", r.grad_norm},
              {"tokens", r.tokens},
              {"tokens_per_second", r.tokens_per_s},
              {"elapsed_s", r.elapsed_s}});
}

void MetricsFile::eval(int64_t step, double loss, int64_t tokens, double elapsed_s) {
  write_line({{"type", "eval"}, {"step", step}, {"loss", loss}, {"tokens", tokens}, {"elapsed_s", elapsed_s}});
}

}  // namespace sf
