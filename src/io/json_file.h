// JSON files (config.json, tokenizer.json, index files, trainer state) with user-facing errors, and
// JsonRef: the one checked reader of JSON values (type, range, JSON path in the message).
#pragma once
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace sf {

// Nesting limit of configs, safetensors headers, index files and trainer_state.json (real ones
// nest 3 or 4 deep). Checked on the bytes before any parser runs: nothing recursive (nlohmann's
// dump and comparisons, our readers) ever sees deeper input.
constexpr int kJsonMaxDepth = 64;
// Largest JSON file read whole: tokenizer.json of real models is under 40 MB, the rest far smaller;
// a tree of a file this size takes up to ~10x it in memory.
constexpr size_t kJsonMaxFileBytes = size_t(64) << 20;
// config.json: a few KB in real models.
constexpr size_t kConfigMaxFileBytes = size_t(16) << 20;

struct JsonLimits {
  int max_depth = kJsonMaxDepth;
  size_t max_bytes = kJsonMaxFileBytes;
};

// InputError("where: JSON nested deeper than N at byte B") for text nested deeper than max_depth
// (containers outside strings; the top-level value is depth 1).
void check_json_depth(const std::string& where, const char* begin, const char* end, int max_depth);

// InputError("where: ...") for what nlohmann's parser would take silently: a NUL byte (its lexer
// reads NUL as the end of the input, so "{...}\0anything" parsed as "{...}"), and a number whose
// literal is out of the range of a double (1e999; 1e-400, which it reads as 0). Cheap when the text
// has no 'e'/'E' (token ids): one memchr. Every JSON text read from a file goes through it.
void check_json_text(const std::string& where, const char* begin, const char* end);

// Parses [begin, end) after the depth and text checks. Syntax errors and numbers out of range (1e400) are
// InputError("where: invalid JSON at byte N: ..."); nothing from nlohmann escapes.
nlohmann::json parse_json_text(const std::string& where, const char* begin, const char* end,
                               int max_depth = kJsonMaxDepth);

// Missing -> InputError("path: not found"); unparsable -> InputError("path: invalid JSON at byte N: ...");
// larger than limits.max_bytes or deeper than limits.max_depth -> InputError naming the limit.
nlohmann::json read_json_file(const std::string& path, const JsonLimits& limits = {});
// Same, keeping the file's key order (for files written back, e.g. config.json).
nlohmann::ordered_json read_ordered_json_file(const std::string& path, const JsonLimits& limits = {});

// Pretty-printed (indent 2) with a trailing newline, or compact where indentation would more than
// double a large file (deep nesting); atomic (temp + fsync + rename).
void write_json_file(const std::string& path, const nlohmann::json& j);
void write_json_file(const std::string& path, const nlohmann::ordered_json& j);

// nlohmann's parse_error text without its exception-id prefix: "line 1, column 9: syntax error ...".
std::string describe_json_parse_error(const std::exception& e);

// A JSON value with the file it came from and its JSON path ("$.rope_scaling.factor"), for typed
// reads whose every error is InputError("file: $.path: expected a number, got a string") or
// ("file: $.path: 4294967296 is out of range [1, 1024]"). Integers are read as int64 and
// range-checked before the caller narrows them. The referenced json must outlive the JsonRef.
class JsonRef {
 public:
  JsonRef(const nlohmann::json& v, std::string file, std::string path = "$")
      : v_(&v), file_(std::move(file)), path_(std::move(path)) {}

  const nlohmann::json& json() const { return *v_; }
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& what) const;

  // Objects. `get`: absent or null -> nullopt. `at`: absent or null -> "missing".
  bool has(const std::string& key) const;  // present and not null
  std::optional<JsonRef> get(const std::string& key) const;
  JsonRef at(const std::string& key) const;
  // Arrays.
  size_t size() const;  // of an array (or object)
  JsonRef at(size_t i) const;

  const JsonRef& expect_object() const;
  const JsonRef& expect_array() const;
  // An integer in [lo, hi]. With integral_floats, 4.0 counts as 4 (HF configs have such); 1.5 never does.
  int64_t as_int(int64_t lo, int64_t hi, bool integral_floats = true) const;
  double as_number(double lo, double hi) const;  // finite, in [lo, hi]
  bool as_bool() const;
  std::string as_string(size_t max_bytes = 1 << 20) const;

  // Optional members: absent or null -> fallback; present -> checked as above.
  int64_t int_or(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  double number_or(const std::string& key, double fallback, double lo, double hi) const;
  bool bool_or(const std::string& key, bool fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;

 private:
  const nlohmann::json* v_;
  std::string file_, path_;
};

// "a string", "an object", "1.5", "-3" ...: what a value is, for "expected X, got Y".
std::string json_kind(const nlohmann::json& v);
// path + ".key" (identifier keys) or path + "[\"key\"]" (others, shortened when long).
std::string json_child_path(const std::string& path, const std::string& key);

}  // namespace sf
