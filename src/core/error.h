// Errors. InputError = the user's input is wrong (exit code 2, one line naming file and problem).
// Everything else is an internal failure (exit code 1).
#pragma once
#include <stdexcept>
#include <string>

namespace sf {

struct InputError : std::runtime_error {
  explicit InputError(const std::string& msg) : std::runtime_error(msg) {}
};

// `where`: a file path (optionally with ":line" or a tensor name); message = "where: what".
[[noreturn]] inline void input_error(const std::string& where, const std::string& what) {
  throw InputError(where.empty() ? what : where + ": " + what);
}

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace sf

#define SF_CHECK(cond, msg)                                                  \
  do {                                                                       \
    if (!(cond)) ::sf::internal_error(__FILE__, __LINE__, std::string(msg)); \
  } while (0)
