#include "io/output_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
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

bool has_marker(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kOutputMarker, ec);
}

// The files an output of ours holds (config, weights, tokenizer, training state): a directory of
// only these is an output of a version that wrote no marker.
bool own_file_name(const std::string& n) {
  static const std::regex own(
      R"(config\.json|generation_config\.json|model\.safetensors|model\.safetensors\.index\.json|)"
      R"(model-\d+-of-\d+\.safetensors|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|)"
      R"(tokenizer\.model|vocab\.json|merges\.txt|added_tokens\.json|chat_template\.jinja|)"
      R"(training_state\.safetensors|trainer_state\.json)");
  return std::regex_match(n, own);
}
bool checkpoint_dir_name(const std::string& n) {
  static const std::regex ck(R"(checkpoint-\d+)");
  return std::regex_match(n, ck);
}
// Weights of an old output that must not be carried next to new ones.
bool weight_file_name(const std::string& n) {
  static const std::regex w(R"(model\.safetensors|model\.safetensors\.index\.json|model-\d+-of-\d+\.safetensors)");
  return std::regex_match(n, w);
}

// Empty string when `dir` is ours (or empty), else the first entry that says it is not.
std::string foreign_entry(const fs::path& dir, bool nested = false) {
  if (has_marker(dir)) return "";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file(ec) && !e.is_symlink(ec) && own_file_name(n)) continue;
    if (!nested && e.is_directory(ec) && !e.is_symlink(ec) && checkpoint_dir_name(n) &&
        foreign_entry(e.path(), true).empty())
      continue;
    return n;
  }
  if (ec) input_error(dir.string(), "cannot list directory: " + ec.message());
  return "";
}

// "<name>.<kind>-<pid>-<hex>" of a process that is gone (another live run may be writing it).
bool stale_temp_name(const std::string& n, const std::string& base, const char* kind = "tmp") {
  const std::regex tmp(std::string(R"((.*)\.)") + kind + R"(-(\d+)-[0-9a-f]+)");
  std::smatch m;
  if (!std::regex_match(n, m, tmp)) return false;
  if (!base.empty() && m[1].str() != base) return false;
  const long pid = std::strtol(m[2].str().c_str(), nullptr, 10);
  if (pid == long(::getpid())) return false;
  return !(pid > 0 && ::kill(pid_t(pid), 0) == 0);
}

void remove_stale(const fs::path& p, const char* what) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) input_error(p.string(), std::string("cannot remove ") + what + ": " + ec.message());
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

bool empty_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_empty(p, ec) && !ec;
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
    std::string cand = final_dir + ".tmp-" + unique_suffix();
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
  const std::string bad = foreign_entry(dir);
  if (!bad.empty())
    input_error_naming(dir, {"exists and holds " + bad +
                                 ", which slideformer did not write; refusing to replace it (choose a new or empty ",
                             Setting::Output, " directory)"});
}

namespace {

// In `parent`: "<base>.old-*" (an old output moved aside by a publish that was killed before the
// new one was in place, on filesystems without RENAME_EXCHANGE) goes back if <base> is missing,
// else it is garbage; marked (or empty) "<base>.tmp-*" are staged outputs of killed runs, or
// replaced old ones. Empty `base`: every name in `parent` (the checkpoints inside an output).
void recover_entries(const fs::path& parent, const std::string& base) {
  std::error_code ec;
  std::vector<fs::path> old, tmp;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string n = e.path().filename().string();
    if (stale_temp_name(n, base, "old") && e.is_directory(ec) && !e.is_symlink(ec) && has_marker(e.path()))
      old.push_back(e.path());
    else if (stale_temp_name(n, base) && (base.empty() || (e.is_directory(ec) && !e.is_symlink(ec) &&
                                                           (has_marker(e.path()) || empty_dir(e.path())))))
      tmp.push_back(e.path());
  }
  if (ec) input_error(parent.string(), "cannot list directory: " + ec.message());
  for (const fs::path& p : old) {
    const std::string n = p.filename().string();
    const fs::path orig = parent / n.substr(0, n.rfind(".old-"));
    if (!fs::exists(orig, ec)) {
      if (::rename(p.c_str(), orig.c_str()) != 0)
        input_error(orig.string(), "cannot restore from " + p.string() + ": " + std::strerror(errno));
      log_info("restored %s from %s (a save was interrupted)", orig.c_str(), p.c_str());
    } else {
      remove_stale(p, "replaced output");
    }
  }
  for (const fs::path& p : tmp) remove_stale(p, fs::is_directory(p, ec) ? "temporary directory" : "temporary file");
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
    std::error_code ec;
    fs::remove_all(tmp_, ec);  // best effort: a destructor must not throw
  }
}

void StagedDir::commit() {
  SF_CHECK(!committed_, "StagedDir::commit twice");
  std::error_code ec;
  const std::string parent = fs::path(final_).parent_path().string();
  fsync_dir(tmp_);
  if (!fs::exists(final_, ec)) {
    rename_noreplace(tmp_, final_);
    committed_ = true;
    fsync_dir(parent);
    return;
  }
  check_output_dir(final_);  // still ours (it may have changed since the run started)
  // Keep every old entry the new output does not replace: checkpoints saved so far, a user's notes.
  for (const auto& e : fs::directory_iterator(final_, ec)) {
    const std::string n = e.path().filename().string();
    if (fs::exists(fs::path(tmp_) / n, ec) || weight_file_name(n) || stale_temp_name(n, "")) continue;
    link_tree(e.path(), fs::path(tmp_) / n);
  }
  if (ec) input_error(final_, "cannot list directory: " + ec.message());
  fsync_dir(tmp_);
  if (exchange_paths(tmp_, final_)) {
    committed_ = true;  // tmp_ now names the old directory: everything in it is linked in the new one
    fsync_dir(parent);
    crash_point("remove old");
    fs::remove_all(tmp_, ec);  // a failure leaves a marked ".tmp-" that the next run removes
    return;
  }
  // A filesystem without RENAME_EXCHANGE: the old directory steps aside under a temporary name
  // (which the next run on this output removes if a kill comes before the new one is in place).
  const std::string old = final_ + ".old-" + unique_suffix();
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
  fs::remove_all(old, ec);
}

}  // namespace sf
