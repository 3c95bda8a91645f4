// Values of the Jinja subset (src/data/jinja_*.h): Python-like none/bool/int/float/string/list/dict,
// plus Jinja's undefined and namespace objects. Lists and dicts are shared (reference semantics as
// in Python); dicts keep insertion order and have string keys (chat messages are JSON objects).
// Integers beyond 64 bits (from JSON input) keep their decimal digits and print as Python prints
// them; arithmetic on them is refused.
// Nesting is bounded where a value is built (kMaxNesting), and a namespace may not hold a
// namespace: values form no cycle, and printing, comparing or freeing one recurses boundedly.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sf::jinja {

// A template that cannot be rendered (raise_exception, a type error, a limit): the message says why.
struct RenderError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Deepest nesting of lists and dicts; a namespace's attributes nest at most half of it (the namespace
// counts as that deep inside other containers).
constexpr int kMaxNesting = 512;
constexpr int kNamespaceDepth = kMaxNesting / 2;

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

struct Value {
  enum Kind { Undefined, None, Bool, Int, BigInt, Float, Str, ListK, DictK, Namespace };
  Kind kind = Undefined;
  uint16_t depth = 0;     // containers: 1 + the deepest item's depth; a namespace counts as kNamespaceDepth
  bool holds_ns = false;  // a namespace, or a container holding one
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;               // Str; BigInt: the decimal digits (a leading '-'); Undefined: the name looked up
  std::shared_ptr<List> list;  // ListK
  bool tuple = false;          // ListK made as a tuple (prints as Python prints a tuple)
  std::shared_ptr<Dict> dict;  // DictK, Namespace

  static Value none() { return make(None); }
  static Value boolean(bool v) {
    Value x = make(Bool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = make(Int);
    x.i = v;
    return x;
  }
  static Value real(double v) {
    Value x = make(Float);
    x.f = v;
    return x;
  }
  static Value str(std::string v) {
    Value x = make(Str);
    x.s = std::move(v);
    return x;
  }
  static Value big_integer(std::string digits) {
    Value x = make(BigInt);
    x.s = std::move(digits);
    return x;
  }
  // RenderError when the result would nest deeper than kMaxNesting (or a namespace would hold one).
  static Value new_list(List v = {});
  static Value new_dict(Dict v = {}, Kind k = DictK);
  // Stores `v` as `key` of this dict or namespace (replacing in place, else appended), with the checks
  // of new_dict.
  void set_item(const std::string& key, Value v);
  static Value undefined(std::string name) {
    Value x;
    x.s = std::move(name);
    return x;
  }
  // From a parsed JSON value (nlohmann's objects are sorted by key: use parse_json where the
  // order of the text matters).
  static Value from_json(const nlohmann::json& j);
  // From JSON text, keeping the objects' key order and the digits of integers beyond 64 bits (as
  // Python's json.loads; a repeated key keeps its first place and its last value). RenderError
  // for malformed text or nesting deeper than kMaxNesting.
  static Value parse_json(const std::string& text);

  bool is_undefined() const { return kind == Undefined; }
  bool is_none() const { return kind == None; }
  bool is_number() const { return kind == Int || kind == Float; }  // BigInt aside: no arithmetic
  bool truthy() const;
  // dict (or namespace) member; nullptr when absent.
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);

 private:
  static Value make(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
};

// Python's str() of a value (as {{ x }} prints it); undefined prints as "".
std::string to_str(const Value& v);
// Python's repr() (strings quoted), used inside lists and dicts.
std::string repr(const Value& v);
// Python's json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none), as transformers'
// tojson filter.
std::string to_json(const Value& v, int indent = -1, bool sort_keys = false);
bool equal(const Value& a, const Value& b);
const char* kind_name(const Value& v);

}  // namespace sf::jinja
