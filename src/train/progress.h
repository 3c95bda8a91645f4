// What `train` shows while it runs (stderr) and records (--metrics FILE.jsonl).
//
// ProgressDisplay: on a terminal one line updated in place each step (carriage return, cleared to
// the end); otherwise plain lines, one every --log-every steps (and the first and last), so that a
// log file or a pipe gets whole lines. MetricsFile: one JSON object a line per optimizer step and
// per evaluation, each written with one write() and flushed to the file at once, so a crash or a
// kill leaves every line written so far whole and valid.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace sf {

struct StepReport {
  int64_t step = 0, total = 0;  // 1-based optimizer step of total
  double loss = 0, lr = 0, grad_norm = 0;
  int64_t tokens = 0;       // tokens of this step (cut records, padding excluded)
  double tokens_per_s = 0;  // of this step
  double elapsed_s = 0, eta_s = 0;
  size_t gpu_bytes = 0;  // GPU memory the engine holds; 0 = not reported (cpu)
  size_t rss_bytes = 0;  // host resident set; 0 = unknown
};

// "step 3/100 loss 2.345600 lr 1.000e-05 grad_norm 0.8123 tok/s 1234 elapsed 4s eta 2m05s[ gpu 7.00 GiB] rss 1.20 GiB"
std::string format_step(const StepReport& r);

// The process's current resident set size (/proc/self/statm); 0 when unknown.
size_t current_rss_bytes();

class ProgressDisplay {
 public:
  // tty: update one line in place; else a line every log_every steps (0 = none), the first and the last.
  ProgressDisplay(std::FILE* out, bool tty, int64_t log_every);
  ~ProgressDisplay();
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  void step(const StepReport& r);
  // Ends the updating line (tty) so that another message starts on a line of its own.
  void break_line();

  // Whether stderr is a terminal and the log level shows progress.
  static bool stderr_is_tty();

 private:
  std::FILE* out_;
  bool tty_;
  int64_t log_every_;
  bool pending_ = false;  // tty: a line without its newline is on screen
};

// An existing --metrics file is truncated (or appended to, on --resume) only when slideformer wrote
// it: empty, or every line a record of ours (a JSON object with "type" "train" or "eval" and an
// integer "step"; after such lines the last may be cut short). Anything else (a data file, someone's notes, a
// device or a directory) -> InputError naming --metrics, nothing touched.
void check_metrics_file(const std::string& path);

class MetricsFile {
 public:
  // path "": off. append: continue an existing file (--resume), else truncate it. InputError naming
  // --metrics when it cannot be opened, and when a write fails (a full disk).
  MetricsFile(const std::string& path, bool append);
  ~MetricsFile();
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  bool on() const { return fd_ >= 0; }
  // {"type": "train", "step", "loss", "lr", "grad_norm", "tokens", "tokens_per_second", "elapsed_s"}
  void train_step(const StepReport& r);
  // {"type": "eval", "step", "loss", "tokens", "elapsed_s"}
  void eval(int64_t step, double loss, int64_t tokens, double elapsed_s);

 private:
  void write_line(const nlohmann::json& j);
  std::string path_;
  int fd_ = -1;
};

}  // namespace sf
