// Shared by the fuzz harnesses (fuzz/fuzz_*.cpp): each defines LLVMFuzzerTestOneInput, which feeds one
// input to a parser the way the program reads it (from a file) and lets through only InputError, the
// exit-2 error of bad input. Anything else (a crash, a sanitizer report, another exception: exit 1)
// is a finding. Built as libFuzzer targets with clang (`make fuzz`), and with any compiler into
// fuzz_replay, which runs the harnesses over the seed corpus and every input that ever crashed (ctest).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace sf::fuzz {

// The input as a file (the parsers read files): one per process, rewritten for each input.
inline std::string input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    return std::string(t && *t ? t : "/tmp");
  }();
  const std::string path = dir + "/sf_fuzz_" + std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  if (std::fclose(f) != 0) std::abort();
  return path;
}

// Runs `parse`; an InputError is the expected outcome of bad input, so it is swallowed, after
// checking that its message stays one bounded line (issue 9).
template <class F>
void expect_input_error_or_success(F&& parse) {
  try {
    parse();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    if (msg.size() > 4096 || msg.find('\n') != std::string::npos) {
      std::fprintf(stderr, "InputError message unbounded or multi-line (%zu bytes)\n", msg.size());
      std::abort();
    }
  }
}

}  // namespace sf::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
