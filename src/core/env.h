// Every environment variable slideformer reads, in one table, and the one accessor that reads
// them. Options belong on the command line; these are the few settings that are not a training
// choice (thread count, a diagnostic timeline, kernel variants under measurement, one engine
// mechanism still being measured). README lists the same table. Fault-injection hooks for tests
// are apart, in core/test_hooks.h.
#pragma once
#include <cstdlib>
#include <string>

namespace sf {

enum class Env {
  Threads,    // SF_THREADS
  Trace,      // SF_TRACE
  HoldGrads,  // SF_HOLD_GRADS
  HoldEarly,  // SF_HOLD_EARLY
  AdamwIsa,   // SF_ADAMW_ISA
  Cufile,     // SF_CUFILE
};

struct EnvVar {
  Env id;
  const char* name;
  const char* type;  // "int", "switch" (0 off, anything else on), "path"
  const char* dflt;  // what unset means
  const char* meaning;
};

// In the order of Env.
inline constexpr EnvVar kEnvVars[] = {
    {Env::Threads, "SF_THREADS", "int", "the CPUs of the affinity mask and cgroup quota",
     "host threads: the host AdamW, the cpu backend's kernels, the tokenizer's encode_batch"},
    {Env::Trace, "SF_TRACE", "path", "off",
     "write a timeline of the sliding engine's streams to this file (tools/trace_summary.py reads it)"},
    {Env::HoldGrads, "SF_HOLD_GRADS", "int", "1",
     "without clipping, hold the last blobs' gradients (forward order) and update them in the next "
     "forward: 0 = none, 1 = as many as the planner predicts pay, N > 1 = N parameters (changes the "
     "plan; +2 B of pinned memory a held parameter)"},
    {Env::HoldEarly, "SF_HOLD_EARLY", "int", "-1",
     "of each held update, the percentage run as its gradient lands, during the backward (the rest in the "
     "next forward): -1 = the planner's choice with the held count, 0..100 = that share (changes the plan)"},
    {Env::AdamwIsa, "SF_ADAMW_ISA", "text", "the widest the CPU has",
     "the host AdamW's element loop: avx2, sse2 or scalar (never wider than the CPU has; the same bits "
     "on every path: tests run each, benchmarks compare them)"},
    {Env::Cufile, "SF_CUFILE", "text", "auto",
     "checkpoints in the offload dir through GPUDirect Storage (cuFile) where libcufile loads: auto, 0 (never: "
     "io_uring + pinned bounce), or the library's path"},
};

inline const EnvVar& env_var(Env e) { return kEnvVars[static_cast<int>(e)]; }

// The one reader: the variable's text, or "" when unset.
inline std::string env_text(Env e) {
  const char* v = std::getenv(env_var(e).name);
  return v ? std::string(v) : std::string();
}

// An integer variable; unset, empty or not a whole number: `dflt`.
inline long long env_int(Env e, long long dflt) {
  const std::string v = env_text(e);
  if (v.empty()) return dflt;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  return end && *end == 0 ? x : dflt;
}

// A switch: "0" off, any other text on; unset or empty: `dflt`.
inline bool env_switch(Env e, bool dflt) {
  const std::string v = env_text(e);
  return v.empty() ? dflt : v != "0";
}

}  // namespace sf
