// A timeline of the sliding engine's streams, for finding where a step's time goes on a real
// machine (SF_TRACE=FILE). Each mark is a timing event recorded on a stream: it notes when that
// stream reaches it (the work queued before it is done) without blocking anything — not a host
// function, since CUDA runs every stream's host functions on one thread, where the host AdamW
// runs. Host marks note the host's clock, on the same time base (the trace's first event).
// Marks create an event each, so tracing is off unless asked for. The file is written as JSON
// lines {"t": seconds, "stream": name, "what": text} when the trace is destroyed (its streams idle);
// tools/trace_summary.py turns it into a per-step table.
#pragma once
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/device.h"

namespace sf {

class StepTrace {
 public:
  // Null unless SF_TRACE names a file. `s`: an idle stream, for the time base.
  static std::unique_ptr<StepTrace> from_env(Device& dev, Stream& s);
  StepTrace(Device& dev, std::string path, Stream& s);
  ~StepTrace();
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  void mark(Stream& s, const char* stream, std::string what);  // when `s` gets here
  void now(const char* stream, std::string what);              // when the host gets here

 private:
  struct Mark {
    double t;                      // host marks: seconds from the start
    std::unique_ptr<Event> event;  // stream marks
    const char* stream;
    std::string what;
  };
  Device& dev_;
  std::string path_;
  std::unique_ptr<Event> start_;  // completed at t0_
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
  std::vector<Mark> marks_;
};

}  // namespace sf
