// Checked reading of tokenizer.json values: every wrong type, missing key or out-of-range number
// is an InputError naming the file and the JSON path (e.g. "tokenizer.json: model.vocab["x"]: ...").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace sf::tokjson {

using json = nlohmann::json;

inline std::string idx_path(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

struct Ctx {
  std::string file;
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    input_error(file, (path.empty() ? std::string() : path + ": ") + what);
  }
  const json& obj(const json& j, const std::string& path) const {
    if (!j.is_object()) fail(path, std::string("expected an object, found ") + j.type_name());
    return j;
  }
  const json& arr(const json& j, const std::string& path) const {
    if (!j.is_array()) fail(path, std::string("expected an array, found ") + j.type_name());
    return j;
  }
  // The member `key` of object j (at path); missing -> error.
  const json& at(const json& j, const std::string& path, const char* key) const {
    obj(j, path);
    auto it = j.find(key);
    if (it == j.end()) fail(path, std::string("missing \"") + key + "\"");
    return *it;
  }
  // Optional member: nullptr when absent (or null when null_is_absent).
  const json* opt(const json& j, const std::string& path, const char* key, bool null_is_absent = true) const {
    obj(j, path);
    auto it = j.find(key);
    if (it == j.end() || (null_is_absent && it->is_null())) return nullptr;
    return &*it;
  }
  std::string str(const json& j, const std::string& path) const {
    if (!j.is_string()) fail(path, std::string("expected a string, found ") + j.type_name());
    return j.get<std::string>();
  }
  bool boolean(const json& j, const std::string& path) const {
    if (!j.is_boolean()) fail(path, std::string("expected true or false, found ") + j.type_name());
    return j.get<bool>();
  }
  // An integer in [lo, hi].
  int64_t integer(const json& j, const std::string& path, int64_t lo, int64_t hi) const {
    if (!j.is_number_integer()) fail(path, std::string("expected an integer, found ") + j.type_name());
    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)) fail(path, "integer out of range");
    const int64_t v = j.get<int64_t>();
    if (v < lo || v > hi)
      fail(path, std::to_string(v) + " is out of range " +
                     (hi == INT64_MAX ? "(at least " + std::to_string(lo) + ")"
                                      : "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]"));
    return v;
  }
  std::string str_or(const json& j, const std::string& path, const char* key, const std::string& dflt) const {
    const json* v = opt(j, path, key);
    return v ? str(*v, path + "." + key) : dflt;
  }
  bool bool_or(const json& j, const std::string& path, const char* key, bool dflt) const {
    const json* v = opt(j, path, key);
    return v ? boolean(*v, path + "." + key) : dflt;
  }
  std::string type(const json& j, const std::string& path) const { return str(at(j, path, "type"), path + ".type"); }
  // fn(item, its path) for each item of the array j[key], e.g. the steps of a {"type": "Sequence"}.
  template <class Fn>
  void each(const json& j, const std::string& path, const char* key, Fn&& fn) const {
    const std::string p = path + "." + key;
    const json& list = arr(at(j, path, key), p);
    for (size_t i = 0; i < list.size(); ++i) fn(list[i], idx_path(p, i));
  }
};

// A JSON key shown in a path, cut short and quoted.
inline std::string key_path(const std::string& path, const std::string& key) {
  std::string k = key.size() > 40 ? key.substr(0, 40) + "..." : key;
  return path + "[" + json(k).dump(-1, ' ', false, json::error_handler_t::replace) + "]";
}

}  // namespace sf::tokjson
