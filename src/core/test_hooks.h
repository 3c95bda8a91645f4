// Fault-injection hooks, for tests only: each is an environment variable that makes the program
// fail on purpose at a chosen point, so that tests can prove what survives a crash or a signal.
// Nothing else in the program reads these variables; an ordinary run has them unset.
#pragma once
#include <cstdlib>

namespace sf::test_hooks {

namespace detail {
inline long long read_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : 0;
}
}  // namespace detail

// SF_KILL_AT_STEP=N: SIGKILL at the start of training step N (1-based), as a crash would; 0: never.
inline long long kill_at_step() { return detail::read_int("SF_KILL_AT_STEP"); }
// SF_RAISE_SIGINT_AT_STEP=N: raise SIGINT at the start of step N, as a Ctrl-C then would; 0: never.
inline long long raise_sigint_at_step() { return detail::read_int("SF_RAISE_SIGINT_AT_STEP"); }
// SF_CRASH_AT=N: SIGKILL at the N-th crash point (every rename, fsync and link of a save); 0: never.
inline long long crash_at() { return detail::read_int("SF_CRASH_AT"); }
// SF_CRASH_TRACE=1: print each crash point as it passes (to find the N for SF_CRASH_AT).
inline bool crash_trace() { return std::getenv("SF_CRASH_TRACE") != nullptr; }
// SF_TEST_NO_EXCHANGE=1: behave as a filesystem without renameat2(RENAME_EXCHANGE).
inline bool no_exchange() { return std::getenv("SF_TEST_NO_EXCHANGE") != nullptr; }

// SF_DISK_PROBE_MIB=N: `plan --measure --offload-dir` probes the disk with N MiB each way (tests: a
// quick probe); 0: the full probe.
inline long long disk_probe_mib() { return detail::read_int("SF_DISK_PROBE_MIB"); }
// SF_TEST_DISK_PIECE=N: the engine's NVMe-tier rings (AdamW state, working copies read for the
// uploads) move pieces of N elements (rounded up to whole blocks) instead of the transfer chunk,
// so that a test model's blobs take several pieces; the plan still counts the default (larger)
// rings. 0: the default.
inline long long disk_piece() { return detail::read_int("SF_TEST_DISK_PIECE"); }
}  // namespace sf::test_hooks
