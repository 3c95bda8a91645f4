// Benchmark switches read from the environment (documented in docs/ENGINE.md): one reader, so
// that the planner and the engine it plans for always see the same value.
#pragma once
#include <cstdlib>
#include <string>

namespace sf {

// `name`=0 turns a switch off, any other value on; unset: `dflt`.
inline bool env_switch(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  return std::string(v) != "0";
}

// An integer switch; unset, empty or not a number: `dflt`.
inline long long env_int(const char* name, long long dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return end && *end == 0 ? x : dflt;
}

}  // namespace sf
