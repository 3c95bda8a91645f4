// Errors. InputError = the user's input is wrong (exit code 2, one line naming file and problem).
// Everything else is an internal failure (exit code 1).
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

namespace sf {

// Error messages echo input (keys, values, lines of a file); a hostile file must not turn that into
// a 100 MB stderr line or a multi-line message. Every InputError's text goes through this: control
// characters are escaped (one line) and the text is cut to `max_bytes` (never inside a UTF-8
// sequence), with what was cut said.
std::string bounded_message(const std::string& text, size_t max_bytes);

// Appends byte c with the control characters as escapes (\n \r \t, else \xhh), as Python's repr
// writes them, so a message stays one line; other bytes (UTF-8) as they are.
void append_escaped(std::string& out, unsigned char c);

// The most an InputError's text holds: a long path (kept) plus a few hundred bytes of problem.
constexpr size_t kMaxWhereBytes = 640;  // head and tail of a path are kept (the file name is at the end)
constexpr size_t kMaxWhatBytes = 400;
constexpr size_t kMaxMessageBytes = kMaxWhereBytes + kMaxWhatBytes + 64;

struct InputError : std::runtime_error {
  explicit InputError(const std::string& msg) : std::runtime_error(bounded_message(msg, kMaxMessageBytes)) {}
};

// The `where` part of a message: kept whole up to kMaxWhereBytes, else its head and tail.
std::string bounded_where(const std::string& where);

// `where`: a file path (optionally with ":line" or a tensor name); message = "where: what".
[[noreturn]] inline void input_error(const std::string& where, const std::string& what) {
  throw InputError(where.empty() ? bounded_message(what, kMaxWhatBytes)
                                 : bounded_where(where) + ": " + bounded_message(what, kMaxWhatBytes));
}

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace sf

// The one check of a programming error (a precondition, an argument of the kernel table, a limit of
// a kernel): throws std::runtime_error("file:line: msg"). `msg` (a std::string expression) is built
// only when `cond` fails, so a check on the hot path costs the comparison alone. Usable from .cpp
// and .cu files. Shape / dtype helpers built on it: backend/ops_check.h. (CUDA and cuBLAS status
// codes are another matter: CUDA_CHECK / CUBLAS_CHECK in backend/cuda/cuda_check.h.)
#define SF_CHECK(cond, msg)                                                  \
  do {                                                                       \
    if (!(cond)) ::sf::internal_error(__FILE__, __LINE__, std::string(msg)); \
  } while (0)
