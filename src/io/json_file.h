// JSON files (config.json, tokenizer.json, index files, trainer state) with user-facing errors.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace sf {

// Missing -> InputError("path: not found"); unparsable -> InputError("path: invalid JSON at byte N: ...").
nlohmann::json read_json_file(const std::string& path);
// Same, keeping the file's key order (for files written back, e.g. config.json).
nlohmann::ordered_json read_ordered_json_file(const std::string& path);

// Pretty-printed (indent 2) with a trailing newline; atomic (temp + fsync + rename).
void write_json_file(const std::string& path, const nlohmann::json& j);
void write_json_file(const std::string& path, const nlohmann::ordered_json& j);

// nlohmann's parse_error text without its exception-id prefix: "line 1, column 9: syntax error ...".
std::string describe_json_parse_error(const std::exception& e);

}  // namespace sf
