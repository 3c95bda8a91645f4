#include "data/template/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "core/error.h"

namespace sf::jinja {

Value Value::from_json(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return none();
    case nlohmann::json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return j.get<uint64_t>() > uint64_t(INT64_MAX) ? big_integer(std::to_string(j.get<uint64_t>()))
                                                     : integer(j.get<int64_t>());
    case nlohmann::json::value_t::number_float:
      return real(j.get<double>());
    case nlohmann::json::value_t::string:
      return str(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      for (const auto& x : j) l.push_back(from_json(x));
      return new_list(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), from_json(it.value()));
      return new_dict(std::move(d));
    }
    default:
      return none();
  }
}

namespace {

// Depth and namespace flag of a container of `items`; RenderError beyond the limits.
template <class Items, class Get>
void measure(Value& x, const Items& items, Get get) {
  int deepest = 0;
  bool ns = false;
  for (const auto& it : items) {
    const Value& v = get(it);
    deepest = std::max<int>(deepest, v.depth);
    ns = ns || v.holds_ns;
  }
  if (x.kind == Value::Namespace) {
    if (ns) throw RenderError("a namespace cannot hold a namespace");
    if (deepest >= kNamespaceDepth)
      throw RenderError("a namespace attribute nested deeper than " + std::to_string(kNamespaceDepth - 1) + " levels");
    x.depth = uint16_t(kNamespaceDepth);
    x.holds_ns = true;
    return;
  }
  if (deepest >= kMaxNesting) throw RenderError("values nested deeper than " + std::to_string(kMaxNesting) + " levels");
  x.depth = uint16_t(deepest + 1);
  x.holds_ns = ns;
}

}  // namespace

Value Value::new_list(List v) {
  Value x = make(ListK);
  measure(x, v, [](const Value& e) -> const Value& { return e; });
  x.list = std::make_shared<List>(std::move(v));
  return x;
}

Value Value::new_dict(Dict v, Kind k) {
  Value x = make(k);
  measure(x, v, [](const std::pair<std::string, Value>& e) -> const Value& { return e.second; });
  x.dict = std::make_shared<Dict>(std::move(v));
  return x;
}

void Value::set_item(const std::string& key, Value v) {
  if (kind == Namespace) {
    // A namespace is shared and mutable: what it holds is bounded here, so that no value cycles.
    if (v.holds_ns) throw RenderError("a namespace cannot hold a namespace");
    if (v.depth >= kNamespaceDepth)
      throw RenderError("a namespace attribute nested deeper than " + std::to_string(kNamespaceDepth - 1) + " levels");
  } else {
    if (v.depth >= kMaxNesting) throw RenderError("values nested deeper than " + std::to_string(kMaxNesting) + " levels");
    depth = std::max<uint16_t>(depth, uint16_t(v.depth + 1));
    holds_ns = holds_ns || v.holds_ns;
  }
  if (Value* slot = find(key)) {
    *slot = std::move(v);
  } else {
    dict->emplace_back(key, std::move(v));
  }
}

namespace {

// nlohmann's SAX events to Values: objects in the text's order, integers beyond 64 bits as digits.
class ValueBuilder {
 public:
  using json = nlohmann::json;
  Value root;

  bool null() { return put(Value::none()); }
  bool boolean(bool b) { return put(Value::boolean(b)); }
  bool number_integer(json::number_integer_t v) { return put(Value::integer(v)); }
  bool number_unsigned(json::number_unsigned_t v) {
    return put(v > uint64_t(INT64_MAX) ? Value::big_integer(std::to_string(v)) : Value::integer(int64_t(v)));
  }
  bool number_float(json::number_float_t v, const std::string& text) {
    // nlohmann reads an integer too long for 64 bits as a float; Python keeps every digit.
    if (text.find_first_of(".eE") == std::string::npos) return put(Value::big_integer(text));
    return put(Value::real(v));
  }
  bool string(std::string& s) { return put(Value::str(std::move(s))); }
  bool binary(json::binary_t&) { return put(Value::none()); }
  bool start_object(size_t) { return open(true); }
  bool key(std::string& k) {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    return put(Value::new_dict(std::move(f.dict)));
  }
  bool start_array(size_t) { return open(false); }
  bool end_array() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    return put(Value::new_list(std::move(f.list)));
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw RenderError(std::string("malformed JSON: ") + e.what());
  }

 private:
  struct Frame {
    bool object;
    List list;
    Dict dict;
    std::string key;
    std::unordered_map<std::string, size_t> index;  // key -> place in dict
  };
  std::vector<Frame> stack_;

  bool open(bool object) {
    if (stack_.size() >= size_t(kMaxNesting))
      throw RenderError("JSON nested deeper than " + std::to_string(kMaxNesting) + " levels");
    stack_.push_back(Frame{object, {}, {}, {}, {}});
    return true;
  }
  bool put(Value v) {
    if (stack_.empty()) {
      root = std::move(v);
      return true;
    }
    Frame& f = stack_.back();
    if (!f.object) {
      f.list.push_back(std::move(v));
      return true;
    }
    auto [it, fresh] = f.index.try_emplace(f.key, f.dict.size());
    if (fresh) {
      f.dict.emplace_back(std::move(f.key), std::move(v));
    } else {
      f.dict[it->second].second = std::move(v);  // Python: the first place, the last value
    }
    return true;
  }
};

}  // namespace

Value Value::parse_json(const std::string& text) {
  ValueBuilder b;
  nlohmann::json::sax_parse(text, &b);
  return std::move(b.root);
}

bool Value::truthy() const {
  switch (kind) {
    case Undefined:
    case None:
      return false;
    case Bool:
      return b;
    case Int:
      return i != 0;
    case BigInt:
      return true;  // beyond 64 bits: never zero
    case Float:
      return f != 0;
    case Str:
      return !s.empty();
    case ListK:
      return !list->empty();
    case DictK:
      return !dict->empty();
    case Namespace:
      return true;
  }
  return false;
}

const Value* Value::find(const std::string& key) const {
  if (kind != DictK && kind != Namespace) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}
Value* Value::find(const std::string& key) { return const_cast<Value*>(static_cast<const Value*>(this)->find(key)); }

namespace {

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {  // shortest round-trip, as Python's repr
    std::snprintf(buf, sizeof buf, "%.*g", prec, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s = buf;
  const size_t e = s.find('e');
  if (e != std::string::npos) {
    // Python: 1e+20 -> 1e+20, 1e-05 stays; exponent at least 2 digits (C gives that too).
    const double a = std::fabs(f);
    if (a >= 1e-4 && a < 1e16) {  // Python uses plain notation in this range
      std::snprintf(buf, sizeof buf, "%.17f", f);
      s = buf;
      // trim to the shortest that round-trips
      for (int prec = 0; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*f", prec, f);
        if (std::strtod(buf, nullptr) == f) {
          s = buf;
          break;
        }
      }
    } else {
      return s;
    }
  } else if (std::fabs(f) >= 1e16) {
    std::snprintf(buf, sizeof buf, "%.16e", f);
    return buf;
  }
  if (s.find('.') == std::string::npos && s.find('e') == std::string::npos) s += ".0";
  return s;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, int indent, bool sort_keys, int level) {
  auto newline = [&](int lv) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent) * size_t(lv), ' ');
  };
  switch (v.kind) {
    case Value::Undefined:
    case Value::None:
      out += "null";
      return;
    case Value::Bool:
      out += v.b ? "true" : "false";
      return;
    case Value::Int:
      out += std::to_string(v.i);
      return;
    case Value::BigInt:
      out += v.s;
      return;
    case Value::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Value::Str:
      json_string(out, v.s);
      return;
    case Value::ListK: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& x : *v.list) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        newline(level + 1);
        json_dump(out, x, indent, sort_keys, level + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Namespace:
      throw RenderError("Object of type Namespace is not JSON serializable");
    case Value::DictK: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : *v.dict) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        newline(level + 1);
        json_string(out, kv->first);
        out += ": ";
        json_dump(out, kv->second, indent, sort_keys, level + 1);
      }
      newline(level);
      out += '}';
      return;
    }
  }
}

std::string py_str_repr(const std::string& s) {
  // Python repr: single quotes unless the string has ' and no ".
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\';
      out += char(c);
    } else {
      append_escaped(out, c);
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string repr(const Value& v) {
  if (v.kind == Value::Str) return py_str_repr(v.s);
  return to_str(v);
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Undefined:
      return "";
    case Value::None:
      return "None";
    case Value::Bool:
      return v.b ? "True" : "False";
    case Value::Int:
      return std::to_string(v.i);
    case Value::BigInt:
      return v.s;
    case Value::Float:
      return float_repr(v.f);
    case Value::Str:
      return v.s;
    case Value::ListK: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::DictK: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : *v.dict) {
        out += (first ? "" : ", ") + py_str_repr(k) + ": " + repr(x);
        first = false;
      }
      return out + "}";
    }
    case Value::Namespace:
      return "<Namespace>";
  }
  return "";
}

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_dump(out, v, indent, sort_keys, 0);
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Int && b.kind == Value::Int) return a.i == b.i;
    return (a.kind == Value::Int ? double(a.i) : a.f) == (b.kind == Value::Int ? double(b.i) : b.f);
  }
  if ((a.kind == Value::Bool && b.is_number()) || (b.kind == Value::Bool && a.is_number())) {
    const double x = a.kind == Value::Bool ? a.b : a.kind == Value::Int ? double(a.i) : a.f;
    const double y = b.kind == Value::Bool ? b.b : b.kind == Value::Int ? double(b.i) : b.f;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Undefined:
    case Value::None:
      return true;
    case Value::Bool:
      return a.b == b.b;
    case Value::BigInt:
    case Value::Str:
      return a.s == b.s;
    case Value::ListK:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::DictK:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : *a.dict) {
        const Value* y = b.find(k);
        if (!y || !equal(x, *y)) return false;
      }
      return true;
    case Value::Namespace:
      return a.dict == b.dict;
    default:
      return false;
  }
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Value::Undefined:
      return "undefined";
    case Value::None:
      return "none";
    case Value::Bool:
      return "bool";
    case Value::Int:
    case Value::BigInt:
      return "int";
    case Value::Float:
      return "float";
    case Value::Str:
      return "string";
    case Value::ListK:
      return "list";
    case Value::DictK:
      return "dict";
    case Value::Namespace:
      return "namespace";
  }
  return "?";
}

}  // namespace sf::jinja
