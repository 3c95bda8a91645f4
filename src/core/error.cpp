#include "core/error.h"

namespace sf {

void internal_error(const char* file, int line, const std::string& what) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what);
}

}  // namespace sf
