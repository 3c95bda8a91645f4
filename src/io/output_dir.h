// Output directories that never lose a user's files.
//
// The program replaces only a directory it recognises as its own output: one that carries the
// marker file it writes into every output (kOutputMarker), or an empty one. Anything else (also a
// directory of model files without the marker: save_pretrained's looks just like an output) is
// refused with an InputError before anything is written.
//
// An output is built in a sibling temporary directory "<final>.sf-tmp-<pid>-<rand>" (marker written
// first; a marked name, see marked_temp_name) and published by one atomic step, with a manifest of
// its files (io/manifest.h) written last: rename() when the final directory does not exist, else
// renameat2(RENAME_EXCHANGE) after every entry of the old directory that the new output does not
// replace (intermediate checkpoints, files a user added) has been hard-linked into the new one (a
// copy where links are impossible). A kill at any moment leaves the final path holding either the
// complete old directory or the complete new one, each with every checkpoint saved so far; a
// leftover temporary directory (or one whose removal a kill interrupted) is removed by the next
// run on the same output (claim_output_dir). The new directory keeps the old one's permissions.
#pragma once
#include <string>

namespace sf {

inline constexpr const char* kOutputMarker = ".slideformer-output";

// Whether `dir` may receive an output: it does not exist, is an empty directory, or is a
// slideformer output. Otherwise an InputError naming it and why ("exists and is not a directory";
// "holds X, which slideformer did not write"). Touches nothing.
void check_output_dir(const std::string& dir);

// check_output_dir, then removes what killed runs left on this output (marked "<dir>.sf-tmp-*" and
// "<dir>.sf-trash-*" siblings, "<dir>/*.sf-tmp-*" entries, of processes that are gone; a
// "<dir>.sf-old-*" goes back when <dir> is missing), saying so on stderr. Hold an OutputLock on
// `dir` first (io/output_lock.h): a live run's temporaries are never touched.
void claim_output_dir(const std::string& dir);

// Makes `dir` exist as an (empty) marked output directory if it does not, atomically.
void ensure_output_dir(const std::string& dir);

class StagedDir {
 public:
  // check_output_dir(final_dir); creates parents and the marked temporary sibling.
  explicit StagedDir(const std::string& final_dir);
  ~StagedDir();  // not committed: the temporary directory is removed
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  const std::string& path() const { return tmp_; }  // write the output here
  const std::string& final_path() const { return final_; }
  bool committed() const { return committed_; }
  // Publishes the temporary directory as final_dir (see the top of this file). Entries of an old
  // final_dir that the new output does not contain are kept, except stale model weight files
  // (model*.safetensors and its index), which would mix with the new ones.
  void commit();

 private:
  std::string final_, tmp_;
  bool committed_ = false;
};

}  // namespace sf
