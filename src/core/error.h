// Errors. InputError = the user's input is wrong (exit code 2, one line naming file and problem).
// Everything else is an internal failure (exit code 1).
#pragma once
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

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

// A setting the user chooses that the lower layers may refuse or advise about. The layers below
// train name settings as data, never as command-line options: the CLI owns the option names
// (cli/option_names.h) and renders an InputError with them; what() uses setting_name().
enum class Setting {
  Device,          // which backend
  GpuMemory,       // the GPU memory budget
  HostMemory,      // the host memory budget
  BatchSize,       // sequences a micro-batch
  SeqLen,          // tokens a sequence
  GradAccum,       // micro-batches a step
  Offload,         // the sliding engine (parameters on the host)
  Slots,           // the sliding engine's GPU parameter slots
  GpuBlobs,        // blobs the sliding engine keeps whole on the GPU
  ComputeDtype,    // the engines' compute dtype
  MaxRecordBytes,  // the longest record (line) of a dataset
  Resume,          // the checkpoint a run resumes from
  Output,          // the output directory
  OffloadDir,      // the NVMe store's directory
  DiskMemory,      // the NVMe store's budget
  KeepAttention,   // layers whose attention output the resident engine keeps (selective recompute)
  KeepLayers,      // layers the resident engine keeps whole: no recompute (selective recompute)
  UploadCopies,    // working copies beside the host masters, read by the sliding engine's uploads
  OptimizerState,  // the dtype of AdamW's m and v
};
inline constexpr Setting kAllSettings[] = {
    Setting::Device,         Setting::GpuMemory,  Setting::HostMemory,   Setting::BatchSize,     Setting::SeqLen,
    Setting::GradAccum,      Setting::Offload,    Setting::Slots,        Setting::GpuBlobs,      Setting::ComputeDtype,
    Setting::MaxRecordBytes, Setting::Resume,     Setting::Output,       Setting::OffloadDir,    Setting::DiskMemory,
    Setting::KeepAttention,  Setting::KeepLayers, Setting::UploadCopies, Setting::OptimizerState};
static_assert(std::size(kAllSettings) == size_t(Setting::OptimizerState) + 1, "kAllSettings lists every Setting");

// The neutral name of a setting ("sequence length"), for library users and tests.
const char* setting_name(Setting s);

// How a layer names settings: setting_name here, the option names in the CLI.
using SettingNamer = const char* (*)(Setting);

// Text that may name settings: plain pieces and settings, rendered with a SettingNamer.
//   SettingText{"shorter than ", Setting::SeqLen, " 17"}
struct SettingText {
  struct Piece {
    Piece(std::string t) : text(std::move(t)) {}  // NOLINT(google-explicit-constructor)
    Piece(const char* t) : text(t) {}             // NOLINT(google-explicit-constructor)
    Piece(Setting s) : setting(s) {}              // NOLINT(google-explicit-constructor)
    std::string text;
    std::optional<Setting> setting;
  };
  SettingText() = default;
  SettingText(std::string t) { pieces.emplace_back(std::move(t)); }  // NOLINT(google-explicit-constructor)
  SettingText(const char* t) { pieces.emplace_back(t); }             // NOLINT(google-explicit-constructor)
  SettingText(std::initializer_list<Piece> p) : pieces(p) {}
  SettingText& operator+=(const SettingText& o) {
    pieces.insert(pieces.end(), o.pieces.begin(), o.pieces.end());
    return *this;
  }
  friend SettingText operator+(SettingText a, const SettingText& b) { return a += b; }

  std::string render(SettingNamer names = setting_name) const;
  std::optional<Setting> first_setting() const;  // the first setting named, if any
  bool empty() const { return pieces.empty(); }

  std::vector<Piece> pieces;
};

struct InputError : std::runtime_error {
  explicit InputError(const std::string& msg) : std::runtime_error(bounded_message(msg, kMaxMessageBytes)) {}
  // "label: detail" (label: a file, or a setting); `setting` as below. what() names the settings
  // with setting_name().
  InputError(SettingText label, SettingText detail, std::optional<Setting> setting);

  // The message with the settings named by `names` (the CLI: option names); what() when the error
  // names no setting.
  std::string message(SettingNamer names) const;

  // The setting refused (the message's subject), or the one the message advises to change; data
  // for callers and tests. Empty when the message names none.
  std::optional<Setting> setting;

 private:
  SettingText label_, detail_;
};

// The `where` part of a message: kept whole up to kMaxWhereBytes, else its head and tail.
std::string bounded_where(const std::string& where);

// `where`: a file path (optionally with ":line" or a tensor name); message = "where: what".
[[noreturn]] inline void input_error(const std::string& where, const std::string& what) {
  throw InputError(where.empty() ? bounded_message(what, kMaxWhatBytes)
                                 : bounded_where(where) + ": " + bounded_message(what, kMaxWhatBytes));
}

// "where: what" where `what` names settings (InputError::setting: the first one it names).
[[noreturn]] void input_error_naming(const std::string& where, SettingText what);

// The setting itself is refused: "setting: what" (the CLI: "--option: what"). `label` when the
// message's subject is more than the setting ({Setting::Device, " cuda"}).
[[noreturn]] void setting_error(Setting setting, SettingText what);
[[noreturn]] void setting_error(Setting setting, SettingText label, SettingText what);

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
