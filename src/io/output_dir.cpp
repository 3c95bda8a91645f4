#include "io/output_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>

#include "core/error.h"
#include "core/test_hooks.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/manifest.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

// "out/" and "out" must name the same directory (a trailing slash would put the temp dir inside it).
std::string normalize_dir(const std::string& d) {
  fs::path p = fs::path(d).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// The marker is a regular file (a link named so is not ours: it could point anywhere).
bool has_marker(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::symlink_status(dir / kOutputMarker, ec));
}

// Weights of an old output that must not be carried next to new ones.
bool weight_file_name(const std::string& n) {
  static const std::regex w(R"(model\.safetensors|model\.safetensors\.index\.json|model-\d+-of-\d+\.safetensors)");
  return std::regex_match(n, w);
}

// Temporaries (of this run, of another live one, or leftovers): never carried into a new output.
bool marked_temp(const std::string& n) {
  return parse_marked_temp(n, kTempKindTmp) || parse_marked_temp(n, kTempKindOld) ||
         parse_marked_temp(n, kTempKindTrash);
}

// A marked temporary name of `kind` whose base is `base` (any base when empty) and whose process
// is gone (a live one may be another run still writing it).
bool stale_temp_name(const std::string& n, const std::string& base, const char* kind) {
  std::string b;
  long pid = 0;
  if (!parse_marked_temp(n, kind, &b, &pid)) return false;
  if (!base.empty() && unmarked_name(b) != base) return false;
  return process_gone(pid);
}

// A leftover of a killed run: its name is marked, so it is ours whatever it holds now (a kill in
// the middle of its removal leaves it part-empty, the marker file perhaps gone).
void remove_stale(const fs::path& p, const char* what) {
  const std::string n = p.filename().string();
  if (parse_marked_temp(n, kTempKindTrash))
    remove_tree(p.string());
  else
    remove_marked_tree(p.string());
  log_info("removed %s %s left by an interrupted run", what, p.string().c_str());
}

// Its existence is the mark (no rename needed): a kill right after the create still leaves it.
void write_marker(const fs::path& dir) {
  const std::string path = (dir / kOutputMarker).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) input_error(path, std::string("cannot create file: ") + std::strerror(errno));
  const char text[] = "written by slideformer: it may replace this directory\n";
  const bool ok = ::write(fd, text, sizeof text - 1) == ssize_t(sizeof text - 1);
  const int err = errno;
  ::close(fd);
  if (!ok) input_error(path, std::string("cannot write: ") + std::strerror(err));
}

void make_parents(const std::string& final_dir) {
  fs::path parent = fs::path(final_dir).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) input_error(parent.string(), "cannot create directory: " + ec.message());
}

std::string make_temp_dir(const std::string& final_dir) {
  std::error_code ec;
  for (int attempt = 0; attempt < 16; ++attempt) {
    std::string cand = marked_temp_name(final_dir, kTempKindTmp);
    if (fs::create_directory(cand, ec)) return cand;
    if (ec) input_error(cand, "cannot create directory: " + ec.message());
  }
  input_error(final_dir, "cannot create a unique temporary directory next to it");
}

// Hard-links (or, where links cannot be made, copies) src into dst, recursively.
void link_tree(const fs::path& src, const fs::path& dst) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(src, ec);
  if (ec) input_error(src.string(), "cannot read: " + ec.message());
  if (fs::is_directory(st)) {
    fs::create_directory(dst, ec);
    if (ec) input_error(dst.string(), "cannot create directory: " + ec.message());
    for (const auto& e : fs::directory_iterator(src, ec)) link_tree(e.path(), dst / e.path().filename());
    if (ec) input_error(src.string(), "cannot list directory: " + ec.message());
    fsync_dir(dst.string());
    return;
  }
  if (fs::is_symlink(st)) {
    fs::copy_symlink(src, dst, ec);
    if (ec) input_error(dst.string(), "cannot copy link: " + ec.message());
    return;
  }
  crash_point("link");
  if (::link(src.c_str(), dst.c_str()) == 0) return;
  const int err = errno;
  if (err != EXDEV && err != EPERM && err != EMLINK && err != EOPNOTSUPP)
    input_error(dst.string(), std::string("cannot link from ") + src.string() + ": " + std::strerror(err));
  fs::copy_file(src, dst, ec);
  if (ec) input_error(dst.string(), "cannot copy from " + src.string() + ": " + ec.message());
  fsync_file(dst.string());
}

bool exchange_paths(const std::string& a, const std::string& b) {
  // SF_TEST_NO_EXCHANGE=1: behave as a filesystem without RENAME_EXCHANGE (tests of the fallback).
  static const bool disabled = test_hooks::no_exchange();
  if (disabled) return false;
  crash_point("exchange");
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) return false;  // filesystem cannot
  input_error(b, std::string("cannot move the finished output into place: ") + std::strerror(errno));
}

void rename_noreplace(const std::string& from, const std::string& to) {
  crash_point("rename");
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {  // no flag support: plain rename
    std::error_code ec;
    if (!fs::exists(to, ec) && ::rename(from.c_str(), to.c_str()) == 0) return;
  }
  input_error(to, std::string("cannot move the finished output into place: ") + std::strerror(errno));
}

}  // namespace

void check_output_dir(const std::string& dir_in) {
  const std::string dir = normalize_dir(dir_in);
  if (dir.empty() || dir == "." || dir == "/" || dir == "..") input_error(dir_in, "not usable as an output directory");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st)) input_error(dir, "exists and is not a directory");
  if (has_marker(dir)) return;
  // Only the marker says a directory is ours: a directory of model files (save_pretrained's, a
  // downloaded model) looks exactly like an output, and guessing from names once deleted one.
  for (const auto& e : fs::directory_iterator(dir, ec))
    input_error_naming(dir, {"exists and holds " + e.path().filename().string() + " (and no " + kOutputMarker +
                                 " marker), which slideformer did not write; refusing to replace it (choose a new "
                                 "or empty ",
                             Setting::Output, " directory)"});
  if (ec) input_error(dir, "cannot list directory: " + ec.message());
}

namespace {

// In `parent`: "<base>.sf-old-*" (an old output moved aside by a publish that was killed before the
// new one was in place, on filesystems without RENAME_EXCHANGE) goes back if <base> is missing,
// else it is garbage; "<base>.sf-tmp-*" (staged outputs of killed runs, or replaced old ones) and
// "<base>.sf-trash-*" (removals a kill interrupted) are removed. Only names of processes that are
// gone. Empty `base`: every name in `parent` (the checkpoints and files inside an output).
void recover_entries(const fs::path& parent, const std::string& base) {
  std::error_code ec;
  std::vector<fs::path> old, tmp;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    if (stale_temp_name(n, base, kTempKindOld) && e.is_directory(ec) && !e.is_symlink(ec) && has_marker(e.path()))
      old.push_back(e.path());
    else if (stale_temp_name(n, base, kTempKindTmp) || stale_temp_name(n, base, kTempKindTrash))
      tmp.push_back(e.path());
  }
  if (ec) input_error(parent.string(), "cannot list directory: " + ec.message());
  for (const fs::path& p : old) {
    std::string orig_name;
    parse_marked_temp(p.filename().string(), kTempKindOld, &orig_name);
    const fs::path orig = parent / orig_name;
    if (!fs::exists(fs::symlink_status(orig, ec))) {
      if (::rename(p.c_str(), orig.c_str()) != 0)
        input_error(orig.string(), "cannot restore from " + p.string() + ": " + std::strerror(errno));
      log_info("restored %s from %s (a save was interrupted)", orig.c_str(), p.c_str());
    } else {
      remove_stale(p, "replaced output");
    }
  }
  for (const fs::path& p : tmp)
    remove_stale(p, fs::is_directory(fs::symlink_status(p, ec)) ? "temporary directory" : "temporary file");
}

}  // namespace

void claim_output_dir(const std::string& dir_in) {
  check_output_dir(dir_in);
  const std::string dir = normalize_dir(dir_in);
  const fs::path d(dir);
  recover_entries(d.has_parent_path() ? d.parent_path() : fs::path("."), d.filename().string());
  std::error_code ec;
  if (fs::is_directory(d, ec) && has_marker(d)) recover_entries(d, "");
}

void ensure_output_dir(const std::string& dir_in) {
  const std::string dir = normalize_dir(dir_in);
  check_output_dir(dir);
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    if (!has_marker(dir)) write_marker(dir);  // empty, or an output of a version without the marker
    return;
  }
  StagedDir s(dir);
  s.commit();
}

StagedDir::StagedDir(const std::string& final_dir) : final_(normalize_dir(final_dir)) {
  check_output_dir(final_dir);
  std::error_code ec;
  if (fs::is_symlink(final_, ec)) {  // publish where it points, not over the link
    final_ = fs::canonical(final_, ec).string();
    if (ec) input_error(final_dir, "cannot resolve link: " + ec.message());
  }
  make_parents(final_);
  tmp_ = make_temp_dir(final_);
  write_marker(tmp_);
}

StagedDir::~StagedDir() {
  if (!committed_ && !tmp_.empty()) {
    try {
      remove_marked_tree(tmp_);
    } catch (const std::exception& e) {  // a destructor must not throw; the next run removes it
      log_info("warning: %s", e.what());
    }
  }
}

namespace {

// Removes what a publish replaced; a failure leaves a marked name that the next run removes.
void remove_replaced(const std::string& path) {
  try {
    remove_marked_tree(path);
  } catch (const InputError& e) {
    log_info("warning: %s (the next run on this output removes it)", e.what());
  }
}

}  // namespace

void StagedDir::commit() {
  SF_CHECK(!committed_, "StagedDir::commit twice");
  std::error_code ec;
  const std::string parent = fs::path(final_).parent_path().string();
  write_manifest(tmp_);  // last: it covers every file of the new output
  fsync_dir(tmp_);
  if (!fs::exists(fs::symlink_status(final_, ec))) {
    rename_noreplace(tmp_, final_);
    committed_ = true;
    fsync_dir(parent);
    return;
  }
  check_output_dir(final_);  // still ours (it may have changed since the run started)
  // The new directory takes the old one's place and its permissions (a user's chmod 700 stays).
  struct stat st;
  if (::stat(final_.c_str(), &st) == 0 && ::chmod(tmp_.c_str(), st.st_mode & 07777) != 0)
    input_error(tmp_, std::string("cannot set permissions: ") + std::strerror(errno));
  // Keep every old entry the new output does not replace: checkpoints saved so far, a user's notes.
  // Never temporaries (another process's, or leftovers) nor old weights.
  for (const auto& e : fs::directory_iterator(final_, ec)) {
    const std::string n = e.path().filename().string();
    std::error_code absent;  // "not found" sets it: kept apart from the listing's error
    if (fs::exists(fs::symlink_status(fs::path(tmp_) / n, absent)) || weight_file_name(n) || marked_temp(n)) continue;
    link_tree(e.path(), fs::path(tmp_) / n);
  }
  if (ec) input_error(final_, "cannot list directory: " + ec.message());
  fsync_dir(tmp_);
  if (exchange_paths(tmp_, final_)) {
    committed_ = true;  // tmp_ now names the old directory: everything in it is linked in the new one
    fsync_dir(parent);
    remove_replaced(tmp_);
    return;
  }
  // A filesystem without RENAME_EXCHANGE: the old directory steps aside under a marked name (which
  // the next run on this output puts back if a kill comes before the new one is in place).
  const std::string old = marked_temp_name(final_, kTempKindOld);
  crash_point("rename aside");
  if (::rename(final_.c_str(), old.c_str()) != 0)
    input_error(final_, std::string("cannot move the existing directory aside: ") + std::strerror(errno));
  crash_point("rename");
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
    const int err = errno;
    if (::rename(old.c_str(), final_.c_str()) != 0) {
      // The old output stays at `old`, marked: the next run on this output restores it.
    }
    input_error(final_, std::string("cannot move the finished output into place: ") + std::strerror(err));
  }
  committed_ = true;
  fsync_dir(parent);
  remove_replaced(old);
}

}  // namespace sf
