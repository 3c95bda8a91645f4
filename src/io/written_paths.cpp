#include "io/written_paths.h"

#include <sys/stat.h>

#include <filesystem>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;

std::string resolved_path(const std::string& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) r = fs::absolute(p, ec).lexically_normal();
  std::string s = r.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool path_within(const std::string& inner, const std::string& outer) {
  if (inner == outer) return true;
  if (outer == "/") return !inner.empty() && inner[0] == '/';
  return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 && inner[outer.size()] == '/';
}

void check_written_apart(const NamedPath& written, const std::vector<NamedPath>& inputs) {
  const std::string w = resolved_path(written.path);
  struct stat ws;
  const bool w_exists = ::stat(written.path.c_str(), &ws) == 0;
  for (const NamedPath& in : inputs) {
    if (in.path.empty()) continue;
    const std::string i = resolved_path(in.path);
    struct stat is;
    const bool same_file = w_exists && ::stat(in.path.c_str(), &is) == 0 && ws.st_dev == is.st_dev &&
                           ws.st_ino == is.st_ino;
    std::string why;
    if (w == i || same_file)
      why = "is the " + in.option + " input " + in.path;
    else if (path_within(w, i))
      why = "lies inside the " + in.option + " input " + in.path;
    else if (path_within(i, w))
      why = "holds the " + in.option + " input " + in.path;
    if (!why.empty())
      input_error(written.option, written.path + ": " + why + "; refusing to write there (choose another path)");
  }
}

}  // namespace sf
