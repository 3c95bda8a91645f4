#include "core/error.h"

namespace sf {

void append_escaped(std::string& out, unsigned char c) {
  static const char* hex = "0123456789abcdef";
  if (c == '\n') {
    out += "\\n";
  } else if (c == '\r') {
    out += "\\r";
  } else if (c == '\t') {
    out += "\\t";
  } else if (c < 0x20 || c == 0x7f) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  } else {
    out += char(c);
  }
}

namespace {

// The largest n' <= n that does not split a UTF-8 sequence of s.
size_t utf8_boundary(const std::string& s, size_t n) {
  if (n >= s.size()) return s.size();
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

std::string escape(const std::string& s, size_t begin, size_t end) {
  std::string out;
  out.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) append_escaped(out, static_cast<unsigned char>(s[i]));
  return out;
}

}  // namespace

std::string bounded_message(const std::string& text, size_t max_bytes) {
  const size_t keep = utf8_boundary(text, max_bytes);
  std::string out = escape(text, 0, keep);
  if (keep == text.size() && out.size() <= max_bytes) return out;
  // Escapes may have grown it: cut the escaped text again (at a UTF-8 boundary).
  if (out.size() > max_bytes) out.resize(utf8_boundary(out, max_bytes));
  return out + "... (" + std::to_string(text.size()) + " bytes, cut)";
}

std::string bounded_where(const std::string& where) {
  if (where.size() <= kMaxWhereBytes) return bounded_message(where, kMaxWhereBytes);
  const size_t head = utf8_boundary(where, 128);
  size_t tail_begin = where.size() - (kMaxWhereBytes - 128);
  while (tail_begin < where.size() && (static_cast<unsigned char>(where[tail_begin]) & 0xC0) == 0x80) ++tail_begin;
  return escape(where, 0, head) + "..." + escape(where, tail_begin, where.size());
}

const char* setting_name(Setting s) {
  switch (s) {
    case Setting::Device:
      return "device";
    case Setting::GpuMemory:
      return "GPU memory budget";
    case Setting::HostMemory:
      return "host memory budget";
    case Setting::BatchSize:
      return "batch size";
    case Setting::SeqLen:
      return "sequence length";
    case Setting::GradAccum:
      return "gradient accumulation";
    case Setting::Offload:
      return "offload";
    case Setting::Slots:
      return "GPU parameter slots";
    case Setting::GpuBlobs:
      return "GPU blobs";
    case Setting::ComputeDtype:
      return "compute dtype";
    case Setting::MaxRecordBytes:
      return "record size limit";
    case Setting::Resume:
      return "resume checkpoint";
    case Setting::Output:
      return "output";
    case Setting::OffloadDir:
      return "offload directory";
    case Setting::DiskMemory:
      return "disk budget";
    case Setting::KeepAttention:
      return "layers keeping attention's output";
    case Setting::KeepLayers:
      return "layers kept whole";
    case Setting::UploadCopies:
      return "upload copies";
    case Setting::OptimizerState:
      return "optimizer state dtype";
  }
  return "setting";
}

std::string SettingText::render(SettingNamer names) const {
  std::string out;
  for (const Piece& p : pieces) out += p.setting ? std::string(names(*p.setting)) : p.text;
  return out;
}

std::optional<Setting> SettingText::first_setting() const {
  for (const Piece& p : pieces)
    if (p.setting) return p.setting;
  return std::nullopt;
}

namespace {

std::string compose(const SettingText& label, const SettingText& detail, SettingNamer names) {
  const std::string what = bounded_message(detail.render(names), kMaxWhatBytes);
  const std::string where = label.render(names);
  return where.empty() ? what : bounded_where(where) + ": " + what;
}

}  // namespace

InputError::InputError(SettingText label, SettingText detail, std::optional<Setting> s)
    : std::runtime_error(compose(label, detail, setting_name)),
      setting(s),
      label_(std::move(label)),
      detail_(std::move(detail)) {}

std::string InputError::message(SettingNamer names) const {
  if (label_.empty() && detail_.empty()) return what();  // made from a plain message
  return compose(label_, detail_, names);
}

void input_error_naming(const std::string& where, SettingText what) {
  const std::optional<Setting> s = what.first_setting();
  throw InputError(where, std::move(what), s);
}

void setting_error(Setting setting, SettingText what) { throw InputError({setting}, std::move(what), setting); }

void setting_error(Setting setting, SettingText label, SettingText what) {
  throw InputError(std::move(label), std::move(what), setting);
}

void internal_error(const char* file, int line, const std::string& what) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what);
}

}  // namespace sf
