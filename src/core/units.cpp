#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace sf {

uint64_t parse_size(const std::string& text, const std::string& option) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) input_error(option, "'" + text + "' is not a size (examples: 5GB, 22GiB, 512MiB)");
  double v;
  try {
    v = std::stod(text.substr(0, i));
  } catch (...) {
    input_error(option, "'" + text + "' is not a size");
  }
  std::string unit = text.substr(i);
  for (auto& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  double mult;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "kb" || unit == "k") {
    mult = 1e3;
  } else if (unit == "mb" || unit == "m") {
    mult = 1e6;
  } else if (unit == "gb" || unit == "g") {
    mult = 1e9;
  } else if (unit == "tb" || unit == "t") {
    mult = 1e12;
  } else if (unit == "kib") {
    mult = 1024.0;
  } else if (unit == "mib") {
    mult = 1024.0 * 1024;
  } else if (unit == "gib") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "tib") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else {
    input_error(option, "unknown unit '" + text.substr(i) + "' in '" + text + "' (use B, KB, MB, GB, KiB, MiB, GiB)");
  }
  return uint64_t(std::llround(v * mult));
}

std::string format_bytes(uint64_t b) {
  char buf[32];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9) return "?";
  const int64_t t = int64_t(seconds + 0.5);
  char buf[32];
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  return buf;
}

size_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

}  // namespace sf
