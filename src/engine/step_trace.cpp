#include "engine/step_trace.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/log.h"

namespace sf {

std::unique_ptr<StepTrace> StepTrace::from_env(Device& dev, Stream& s) {
  const std::string p = env_text(Env::Trace);
  if (p.empty()) return nullptr;
  return std::make_unique<StepTrace>(dev, p, s);
}

StepTrace::StepTrace(Device& dev, std::string path, Stream& s)
    : dev_(dev), path_(std::move(path)), start_(dev.create_timing_event()) {
  dev_.synchronize(s);
  dev_.record(*start_, s);
  dev_.synchronize(*start_);
  t0_ = std::chrono::steady_clock::now();  // within microseconds of the event's completion
  marks_.reserve(1 << 14);
}

void StepTrace::now(const char* stream, std::string what) {
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  std::lock_guard<std::mutex> lock(mu_);
  marks_.push_back(Mark{t, nullptr, stream, std::move(what)});
}

void StepTrace::mark(Stream& s, const char* stream, std::string what) {
  auto e = dev_.create_timing_event();
  dev_.record(*e, s);
  std::lock_guard<std::mutex> lock(mu_);
  marks_.push_back(Mark{0.0, std::move(e), stream, std::move(what)});
}

StepTrace::~StepTrace() {
  std::FILE* f = std::fopen(path_.c_str(), "w");
  if (!f) {
    log_info("SF_TRACE: cannot write %s", path_.c_str());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Mark& m : marks_) {
    if (m.event) {
      dev_.synchronize(*m.event);
      m.t = dev_.elapsed_seconds(*start_, *m.event);
    }
  }
  std::stable_sort(marks_.begin(), marks_.end(), [](const Mark& a, const Mark& b) { return a.t < b.t; });
  for (const Mark& m : marks_) {
    const nlohmann::json j = {{"t", m.t}, {"stream", m.stream}, {"what", m.what}};
    std::fprintf(f, "%s\n", j.dump().c_str());
  }
  std::fclose(f);
}

}  // namespace sf
