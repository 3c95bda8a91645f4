#include "io/json_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sf {

namespace {

std::string read_text(const std::string& path, size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    input_error(path, err == ENOENT ? std::string("not found") : std::string("cannot open: ") + std::strerror(err));
  }
  std::string text;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;  // e.g. EISDIR
      ::close(fd);
      input_error(path, std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0) break;
    // Stops reading at the limit: /dev/zero or a huge file is refused, not buffered.
    if (text.size() + size_t(n) > max_bytes) {
      ::close(fd);
      input_error(path, "larger than the limit of " + std::to_string(max_bytes) + " bytes for a JSON file");
    }
    text.append(buf, size_t(n));
  }
  ::close(fd);
  return text;
}

template <class J>
J parse_checked(const std::string& where, const char* begin, const char* end, int max_depth) {
  check_json_depth(where, begin, end, max_depth);
  check_json_text(where, begin, end);
  try {
    return J::parse(begin, end);
  } catch (const nlohmann::json::parse_error& e) {
    input_error(where, "invalid JSON at byte " + std::to_string(e.byte) + ": " + describe_json_parse_error(e));
  } catch (const nlohmann::json::exception& e) {  // out_of_range 406: a number like 1e400
    input_error(where, "invalid JSON: " + describe_json_parse_error(e));
  }
}

const char* type_phrase(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::binary:
      return "binary data";
    default:
      return "a number";
  }
}

std::string number_text(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  // The shortest text that reads back as the value ("1e+300", not "1.0000000000000001e+300").
  const double d = v.get<double>();
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // 2.0 reads as a float, not as 2
  return s;
}

std::string range_text(int64_t lo, int64_t hi) { return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; }

std::string range_text(double lo, double hi) {
  return "[" + number_text(nlohmann::json(lo)) + ", " + number_text(nlohmann::json(hi)) + "]";
}

}  // namespace

void check_json_depth(const std::string& where, const char* begin, const char* end, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (const char* p = begin; p < end; ++p) {
    const char c = *p;
    if (in_string) {
      if (c == '\\') {
        if (p + 1 < end) ++p;  // the escaped character (a quote or backslash does not end or start anything)
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        input_error(where, "JSON nested deeper than " + std::to_string(max_depth) + " levels at byte " +
                               std::to_string(p - begin));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

void check_json_text(const std::string& where, const char* begin, const char* end) {
  const size_t n = size_t(end - begin);
  if (const void* nul = std::memchr(begin, 0, n))
    input_error(where, "invalid JSON at byte " + std::to_string(static_cast<const char*>(nul) - begin) +
                           ": a NUL byte");
  if (!std::memchr(begin, 'e', n) && !std::memchr(begin, 'E', n)) return;  // no exponent anywhere
  bool in_string = false;
  for (const char* p = begin; p < end; ++p) {
    const char c = *p;
    if (in_string) {
      if (c == '\\' && p + 1 < end)
        ++p;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (c != '-' && !(c >= '0' && c <= '9')) continue;
    const char* q = p;
    bool exponent = false, nonzero = false;
    while (q < end && (std::isdigit(static_cast<unsigned char>(*q)) || *q == '-' || *q == '+' || *q == '.' ||
                       *q == 'e' || *q == 'E')) {
      exponent |= *q == 'e' || *q == 'E';
      nonzero |= !exponent && *q >= '1' && *q <= '9';
      ++q;
    }
    if (exponent) {
      const std::string lit(p, size_t(std::min<ptrdiff_t>(q - p, 64)));
      const double d = std::strtod(std::string(p, q).c_str(), nullptr);
      if (!std::isfinite(d) || (d == 0 && nonzero))
        input_error(where, "invalid JSON at byte " + std::to_string(p - begin) + ": number " + lit +
                               " is out of the range of a double (" +
                               (std::isfinite(d) ? "number underflow: it would read as 0" : "number overflow") + ")");
    }
    p = q - 1;
  }
}

nlohmann::json parse_json_text(const std::string& where, const char* begin, const char* end, int max_depth) {
  return parse_checked<nlohmann::json>(where, begin, end, max_depth);
}

std::string describe_json_parse_error(const std::exception& e) {
  // Keep nlohmann's explanation (line/column, what was expected) minus "[json.exception...] parse error at ".
  std::string m = e.what();
  size_t p = m.find("] ");
  if (p != std::string::npos) m = m.substr(p + 2);
  const std::string noise = "parse error at ";
  if (m.compare(0, noise.size(), noise) == 0) m = m.substr(noise.size());
  return m;
}

nlohmann::json read_json_file(const std::string& path, const JsonLimits& limits) {
  const std::string text = read_text(path, limits.max_bytes);
  return parse_checked<nlohmann::json>(path, text.data(), text.data() + text.size(), limits.max_depth);
}

nlohmann::ordered_json read_ordered_json_file(const std::string& path, const JsonLimits& limits) {
  const std::string text = read_text(path, limits.max_bytes);
  return parse_checked<nlohmann::ordered_json>(path, text.data(), text.data() + text.size(), limits.max_depth);
}

namespace {

// Bytes that indentation by 2 adds to the compact text: a newline and 2 spaces per level before
// every element and closing bracket, and a space after every colon. Recursion depth = nesting
// depth, which the readers bound (kJsonMaxDepth).
template <class J>
size_t indent_overhead(const J& j, size_t depth) {
  if (!j.is_structured() || j.empty()) return 0;
  size_t n = 1 + 2 * depth;  // before the closing bracket
  for (auto it = j.begin(); it != j.end(); ++it) {
    n += 1 + 2 * (depth + 1) + (j.is_object() ? 1 : 0);
    n += indent_overhead(*it, depth + 1);
  }
  return n;
}

// Indented for people, unless indentation would blow the file up: a config nested deep (a copy of
// the input's config.json is written back) grows with depth x size when indented; compact keeps the
// output as large as the input.
template <class J>
std::string json_text(const J& j) {
  std::string compact = j.dump();
  if (indent_overhead(j, 0) > compact.size() + (size_t(64) << 10)) return compact + "\n";
  return j.dump(2) + "\n";
}

}  // namespace

void write_json_file(const std::string& path, const nlohmann::json& j) {
  const std::string s = json_text(j);
  write_file_atomic(path, s.data(), s.size());
}

void write_json_file(const std::string& path, const nlohmann::ordered_json& j) {
  const std::string s = json_text(j);
  write_file_atomic(path, s.data(), s.size());
}

// ---------------------------------------------------------------- JsonRef

std::string json_kind(const nlohmann::json& v) { return v.is_number() ? number_text(v) : type_phrase(v); }

std::string json_child_path(const std::string& path, const std::string& key) {
  bool ident = !key.empty() && key.size() <= 64 && !std::isdigit(static_cast<unsigned char>(key[0]));
  for (char c : key) ident = ident && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (ident) return path + "." + key;
  std::string shown = key.size() > 64 ? key.substr(0, 64) + "..." : key;
  // dump() with replacement: a key that is not valid UTF-8 must not throw here.
  return path + "[" + nlohmann::json(shown).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "]";
}

void JsonRef::fail(const std::string& what) const { input_error(file_, path_ + ": " + what); }

bool JsonRef::has(const std::string& key) const {
  if (!v_->is_object()) return false;
  auto it = v_->find(key);
  return it != v_->end() && !it->is_null();
}

std::optional<JsonRef> JsonRef::get(const std::string& key) const {
  expect_object();
  auto it = v_->find(key);
  if (it == v_->end() || it->is_null()) return std::nullopt;
  return JsonRef(*it, file_, json_child_path(path_, key));
}

JsonRef JsonRef::at(const std::string& key) const {
  std::optional<JsonRef> r = get(key);
  if (!r) input_error(file_, json_child_path(path_, key) + ": missing");
  return *r;
}

size_t JsonRef::size() const {
  if (!v_->is_array() && !v_->is_object()) fail(std::string("expected an array, got ") + json_kind(*v_));
  return v_->size();
}

JsonRef JsonRef::at(size_t i) const {
  expect_array();
  if (i >= v_->size()) fail("has no element " + std::to_string(i));
  return JsonRef((*v_)[i], file_, path_ + "[" + std::to_string(i) + "]");
}

const JsonRef& JsonRef::expect_object() const {
  if (!v_->is_object()) fail("expected an object, got " + json_kind(*v_));
  return *this;
}

const JsonRef& JsonRef::expect_array() const {
  if (!v_->is_array()) fail("expected an array, got " + json_kind(*v_));
  return *this;
}

int64_t JsonRef::as_int(int64_t lo, int64_t hi, bool integral_floats) const {
  const nlohmann::json& v = *v_;
  int64_t x;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      fail(std::to_string(u) + " is out of range " + range_text(lo, hi));
    x = int64_t(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && integral_floats && std::isfinite(v.get<double>()) &&
             v.get<double>() == std::floor(v.get<double>())) {
    const double d = v.get<double>();
    // Compared as doubles first: converting an out-of-range double to int64 is undefined.
    if (!(d >= double(lo) && d <= double(hi)) || d >= 0x1p63 || d < -0x1p63)
      fail(number_text(v) + " is out of range " + range_text(lo, hi));
    x = int64_t(d);
  } else {
    fail("expected an integer, got " + json_kind(v));
  }
  if (x < lo || x > hi) fail(std::to_string(x) + " is out of range " + range_text(lo, hi));
  return x;
}

double JsonRef::as_number(double lo, double hi) const {
  if (!v_->is_number()) fail("expected a number, got " + json_kind(*v_));
  const double d = v_->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) fail(number_text(*v_) + " is out of range " + range_text(lo, hi));
  return d;
}

bool JsonRef::as_bool() const {
  if (!v_->is_boolean()) fail("expected true or false, got " + json_kind(*v_));
  return v_->get<bool>();
}

std::string JsonRef::as_string(size_t max_bytes) const {
  if (!v_->is_string()) fail("expected a string, got " + json_kind(*v_));
  const std::string& s = v_->get_ref<const std::string&>();
  if (s.size() > max_bytes) fail("string of " + std::to_string(s.size()) + " bytes is longer than the limit");
  return s;
}

int64_t JsonRef::int_or(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
  std::optional<JsonRef> r = get(key);
  return r ? r->as_int(lo, hi) : fallback;
}

double JsonRef::number_or(const std::string& key, double fallback, double lo, double hi) const {
  std::optional<JsonRef> r = get(key);
  return r ? r->as_number(lo, hi) : fallback;
}

bool JsonRef::bool_or(const std::string& key, bool fallback) const {
  std::optional<JsonRef> r = get(key);
  return r ? r->as_bool() : fallback;
}

std::string JsonRef::string_or(const std::string& key, const std::string& fallback) const {
  std::optional<JsonRef> r = get(key);
  return r ? r->as_string() : fallback;
}

}  // namespace sf
