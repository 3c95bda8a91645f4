// Human sizes and durations; sizes on the command line: "5GB", "22GiB", "512MiB", "1000000" (bytes).
#pragma once
#include <cstdint>
#include <string>

namespace sf {

// InputError naming `option` when the text is not a size.
uint64_t parse_size(const std::string& text, const std::string& option);
std::string format_bytes(uint64_t bytes);     // "1.50 GiB"
std::string format_duration(double seconds);  // "42s", "7m05s", "3h02m"
// The process's peak resident set (VmHWM of /proc/self/status), 0 where unknown.
size_t peak_rss_bytes();

}  // namespace sf
