// What a command writes (--output, --metrics, grad's --output) must never be what it reads: an
// output that is, holds or lies inside an input (the model directory, a data file, the checkpoint
// resumed from) would replace or truncate the user's files. Paths are compared as the places they
// name (symbolic links, "..", a trailing slash resolved) and files also by identity (a hard link).
#pragma once
#include <string>
#include <vector>

namespace sf {

struct NamedPath {
  std::string option;  // "--model"
  std::string path;
};

// The absolute path `p` names with every symbolic link and "." / ".." of its existing part resolved
// (the rest appended as written, normalised), no trailing slash: two spellings of one place compare
// equal.
std::string resolved_path(const std::string& p);

// Whether `inner` is `outer` or lies inside it (both resolved_path results).
bool path_within(const std::string& inner, const std::string& outer);

// InputError naming `written` ("--output ./m: is the --model directory; refusing to write there")
// when it is one of `inputs` (same place, or the same file by device and inode), lies inside one,
// or holds one. Inputs with an empty path are skipped. Touches nothing.
void check_written_apart(const NamedPath& written, const std::vector<NamedPath>& inputs);

}  // namespace sf
