#include "data/template/jinja_eval.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <unordered_set>

namespace sf::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw RenderError("line " + std::to_string(line) + ": " + what);
}

// ---- UTF-8 (strings are indexed, sliced and measured in code points, as Python's str)
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}
size_t cp_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}
uint32_t decode_cp(const std::string& c) {
  const unsigned char b0 = static_cast<unsigned char>(c[0]);
  if (c.size() == 1) return b0;
  uint32_t cp = c.size() == 2 ? (b0 & 0x1F) : c.size() == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < c.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(c[k]) & 0x3F);
  return cp;
}
// Python's str.isspace() for one code point.
bool py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
// str.strip / lstrip / rstrip: whitespace, or the code points of `chars`.
// One pass over the code points, no copy of each (templates trim every message: `| trim`).
std::string py_strip(const std::string& s, bool left, bool right, const Value* chars) {
  std::set<std::string> set;
  const bool by_chars = chars && chars->kind == Value::Str;
  if (by_chars)
    for (auto& c : code_points(chars->s)) set.insert(c);
  auto length = [&](size_t i) {  // bytes of the code point at i, as code_points() cuts them
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    return i + n > s.size() ? size_t(1) : n;
  };
  auto strip_it = [&](size_t i, size_t n) {
    if (by_chars) return set.count(s.substr(i, n)) > 0;
    return py_space(n == 1 ? static_cast<unsigned char>(s[i]) : decode_cp(s.substr(i, n)));
  };
  size_t a = 0, b = s.size();
  if (left)
    for (size_t n; a < s.size() && strip_it(a, n = length(a));) a += n;
  if (right) {
    b = a;  // the end of the last code point kept
    for (size_t i = a, n; i < s.size(); i += n)
      if (!strip_it(i, n = length(i))) b = i + n;
  }
  return s.substr(a, b - a);
}
// Python's float(s): surrounding whitespace, inf/nan words, out-of-range exponents to inf or 0.0;
// nullopt where Python raises (hexadecimal, junk).
std::optional<double> py_float(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  const std::string t = s.substr(a, b - a);
  if (t.empty() || t.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);  // ERANGE gives +-inf or 0: Python's values
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

// s.find(sub, pos) in linear time (glibc's memmem is the two-way algorithm; std::string::find is
// quadratic on 'aaa...ab' in 'aaa...a', which a hostile template can loop over).
size_t find_sub(const std::string& s, const std::string& sub, size_t pos = 0) {
  if (pos > s.size()) return std::string::npos;
  if (sub.empty()) return pos;
  const void* p = ::memmem(s.data() + pos, s.size() - pos, sub.data(), sub.size());
  return p ? size_t(static_cast<const char*>(p) - s.data()) : std::string::npos;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) {
    if (upper && c >= 'a' && c <= 'z') c = char(c - 32);
    if (!upper && c >= 'A' && c <= 'Z') c = char(c + 32);
  }
  return s;
}
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count,
                        size_t max_items) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between code points
    const auto cps = code_points(s);
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      if (k < cps.size()) out += cps[k];
      if (out.size() > max_items) throw RenderError("replace() result too long");
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = find_sub(s, from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    if (out.size() > max_items) throw RenderError("replace() result too long");
    pos = f + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

struct Scope {
  std::map<std::string, Value> vars;
};

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Renderer(const Dict& vars, std::time_t now, const RenderLimits& lim) : now_(now), lim_(lim) {
    scopes_.emplace_back();
    for (const auto& [k, v] : vars) scopes_.back().vars[k] = v;
  }
  Rendered out;
  uint64_t steps() const { return steps_; }

  Flow exec(const Body& body) {
    for (const NodeP& n : body) {
      const Flow f = exec(*n);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  std::vector<Scope> scopes_;
  std::time_t now_;
  const RenderLimits& lim_;
  uint64_t steps_ = 0;
  int loops_ = 0;
  int depth_ = 0;            // eval/exec recursion (bounded by the parser's tree depth; checked again)
  uint64_t value_bytes_ = 0;  // bytes of values built or copied so far (RenderLimits::max_value_bytes)
  uint64_t iterations_ = 0;   // loop iterations so far (RenderLimits::max_iterations)

 public:
  // The line of the statement or expression evaluated last (for errors thrown without one).
  int last_line() const { return last_line_; }

 private:
  int last_line_ = 0;
  void step(int at) {
    last_line_ = at;
    if (++steps_ > lim_.max_steps)
      fail(at, "the template takes more than " + std::to_string(lim_.max_steps) + " steps");
  }
  // Work proportional to n inside one step (a scan, a comparison of long lists) counts as n steps.
  void work(size_t n, int at) {
    steps_ += n;
    if (steps_ > lim_.max_steps) fail(at, "the template takes more than " + std::to_string(lim_.max_steps) + " steps");
  }
  // Refuses, before allocating, bytes that would take the render past its value budget.
  void afford(uint64_t bytes, int at) const {
    if (bytes > lim_.max_value_bytes || value_bytes_ > lim_.max_value_bytes - bytes)
      fail(at, "the template's values take more than " + std::to_string(lim_.max_value_bytes) + " bytes");
  }
  void charge(uint64_t bytes, int at) {
    afford(bytes, at);
    value_bytes_ += bytes;
  }
  // What copying v's items costs (their strings are copied with them).
  static uint64_t items_bytes(const List& l) {
    uint64_t n = l.size() * sizeof(Value);
    for (const Value& x : l) n += x.s.size();
    return n;
  }
  struct DepthGuard {
    Renderer& r;
    DepthGuard(Renderer& r, int at) : r(r) {
      if (++r.depth_ > 2 * kMaxNesting) fail(at, "evaluation nested deeper than " + std::to_string(2 * kMaxNesting));
    }
    ~DepthGuard() { --r.depth_; }
  };
  void emit(const std::string& s, int line) {
    if (out.text.size() + s.size() > lim_.max_output)
      fail(line, "the output is longer than " + std::to_string(lim_.max_output) + " bytes");
    out.text += s;
  }
  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->vars.find(name);
      if (f != it->vars.end()) return f->second;
    }
    // The functions are defined (Llama 3.2 tests `strftime_now is defined`).
    if (name == "raise_exception" || name == "strftime_now" || name == "namespace" || name == "range" || name == "dict")
      return Value::str("<built-in function " + name + ">");
    return Value::undefined(name);
  }
  void assign(const std::string& name, Value v) { scopes_.back().vars[name] = std::move(v); }

  // ---- statements
  Flow exec(const Node& n) {
    step(n.line);
    DepthGuard g(*this, n.line);
    switch (n.kind) {
      case Node::Text:
        emit(n.text, n.line);
        return Flow::Normal;
      case Node::Output: {
        const Value v = eval(*n.expr);
        emit(to_str(v), n.line);
        return Flow::Normal;
      }
      case Node::If:
        for (const auto& [c, b] : n.branches)
          if (!c || eval(*c).truthy()) return exec(b);
        return Flow::Normal;
      case Node::For:
        return exec_for(n);
      case Node::Set: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value ns = lookup(n.targets[0]);
          if (ns.kind != Value::Namespace)
            fail(n.line, "cannot set an attribute of '" + n.targets[0] + "' (not a namespace)");
          ns.set_item(n.attr, std::move(v));
        } else if (n.targets.size() == 1) {
          assign(n.targets[0], std::move(v));
        } else {
          unpack(n.targets, v, n.line);
        }
        return Flow::Normal;
      }
      case Node::SetBlock: {
        Rendered saved = std::move(out);
        out = Rendered{};
        exec(n.body);
        std::string text = std::move(out.text);
        out = std::move(saved);
        assign(n.targets[0], Value::str(std::move(text)));
        return Flow::Normal;
      }
      case Node::Generation: {
        const size_t start = out.text.size();
        const Flow f = exec(n.body);
        out.generation.emplace_back(start, out.text.size());
        return f;
      }
      case Node::Break:
        if (loops_ == 0) fail(n.line, "'break' outside a loop");
        return Flow::Break;
      case Node::Continue:
        if (loops_ == 0) fail(n.line, "'continue' outside a loop");
        return Flow::Continue;
    }
    return Flow::Normal;
  }

  void unpack(const std::vector<std::string>& targets, const Value& v, int line) {
    const List items = iterate(v, line);
    if (items.size() != targets.size())
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()));
    for (size_t k = 0; k < targets.size(); ++k) assign(targets[k], items[k]);
  }

  // The items of v, copied (charged to the value budget before they are made).
  List iterate(const Value& v, int line) {
    switch (v.kind) {
      case Value::Undefined:
        return {};
      case Value::ListK:
        charge(items_bytes(*v.list), line);
        return *v.list;
      case Value::DictK: {
        uint64_t bytes = v.dict->size() * sizeof(Value);
        for (const auto& kv : *v.dict) bytes += kv.first.size();
        charge(bytes, line);
        List keys;
        for (const auto& kv : *v.dict) keys.push_back(Value::str(kv.first));
        return keys;
      }
      case Value::Str: {
        charge(cp_count(v.s) * (sizeof(Value) + 4), line);
        List cs;
        for (auto& c : code_points(v.s)) cs.push_back(Value::str(c));
        return cs;
      }
      default:
        fail(line, std::string("'") + kind_name(v) + "' is not iterable");
    }
  }

  Flow exec_for(const Node& n) {
    List items = iterate(eval(*n.expr), n.line);
    if (n.cond) {
      iterations_ += items.size();
      if (iterations_ > lim_.max_iterations)
        fail(n.line, "the template's loops run more than " + std::to_string(lim_.max_iterations) + " iterations");  // `for x in xs if cond`: filtered before loop.* is counted
      List kept;
      for (const Value& it : items) {
        scopes_.emplace_back();
        bind_targets(n, it);
        const bool keep = eval(*n.cond).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (!n.else_body.empty()) return exec(n.else_body);
      return Flow::Normal;
    }
    iterations_ += items.size();
    if (iterations_ > lim_.max_iterations)
      fail(n.line, "the template's loops run more than " + std::to_string(lim_.max_iterations) + " iterations");
    ++loops_;
    const int64_t len = int64_t(items.size());
    for (int64_t k = 0; k < len; ++k) {
      step(n.line);
      scopes_.emplace_back();
      Value loop = Value::new_dict({
          {"index", Value::integer(k + 1)},
          {"index0", Value::integer(k)},
          {"revindex", Value::integer(len - k)},
          {"revindex0", Value::integer(len - k - 1)},
          {"first", Value::boolean(k == 0)},
          {"last", Value::boolean(k == len - 1)},
          {"length", Value::integer(len)},
          {"previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("previtem")},
          {"nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undefined("nextitem")},
      });
      assign("loop", loop);
      bind_targets(n, items[size_t(k)]);
      const Flow f = exec(n.body);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
    --loops_;
    return Flow::Normal;
  }
  void bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      assign(n.targets[0], item);
    } else {
      unpack(n.targets, item, n.line);
    }
  }

  // ---- expressions
  // Every value an expression makes is charged to the budget: strings are copied whenever they are
  // read; a list counts when it is new (a list read from a variable is shared, not copied).
  Value eval(const Expr& e) {
    step(e.line);
    DepthGuard g(*this, e.line);
    Value v = eval_uncharged(e);
    if (v.kind == Value::Str) {
      charge(v.s.size(), e.line);
    } else if (v.kind == Value::ListK && v.list.use_count() == 1) {
      charge(v.list->size() * sizeof(Value), e.line);
    }
    return v;
  }
  Value eval_uncharged(const Expr& e) {
    switch (e.kind) {
      case Expr::Literal:
        return e.value;
      case Expr::Name:
        return lookup(e.name);
      case Expr::ListLit:
      case Expr::TupleLit: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        Value v = Value::new_list(std::move(l));
        v.tuple = e.kind == Expr::TupleLit;
        return v;
      }
      case Expr::DictLit: {
        Dict d;  // in the order written, a repeated key keeping its first place (Python's dict)
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (key.kind != Value::Str) fail(e.line, "dictionary keys must be strings here");
          Value v = eval(*e.args[k + 1]);
          auto it = std::find_if(d.begin(), d.end(), [&](const auto& kv) { return kv.first == key.s; });
          if (it != d.end()) {
            it->second = std::move(v);
          } else {
            d.emplace_back(key.s, std::move(v));
          }
        }
        return Value::new_dict(std::move(d));
      }
      case Expr::Attr:
        return attribute(eval(*e.args[0]), e.name, e.line);
      case Expr::Index:
        return subscript(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Slice:
        return slice(e);
      case Expr::Call:
        return call(e);
      case Expr::Filter:
        return filter(e);
      case Expr::Test: {
        const bool r = test(e);
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::Unary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (v.kind == Value::Int) {
          if (e.name == "-" && v.i == INT64_MIN) fail(e.line, "integer overflow");
          return Value::integer(e.name == "-" ? -v.i : v.i);
        }
        if (v.kind == Value::Float) return Value::real(e.name == "-" ? -v.f : v.f);
        if (v.kind == Value::Bool) return Value::integer(e.name == "-" ? -int64_t(v.b) : int64_t(v.b));
        if (v.kind == Value::BigInt) {
          if (e.name == "+") return v;
          return Value::big_integer(v.s[0] == '-' ? v.s.substr(1) : "-" + v.s);
        }
        fail(e.line, std::string("bad operand type for unary ") + e.name + ": '" + kind_name(v) + "'");
      }
      case Expr::Binary:
        return binary(e);
      case Expr::Cond:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined("");
    }
    return Value::none();
  }

  static double num(const Value& v) { return v.kind == Value::Int ? double(v.i) : v.kind == Value::Bool ? v.b : v.f; }
  static bool numeric(const Value& v) { return v.is_number() || v.kind == Value::Bool; }

  [[noreturn]] static void operand_error(const std::string& op, const Value& a, const Value& b, int line) {
    fail(line, "unsupported operand types for " + op + ": '" + kind_name(a) + "' and '" + kind_name(b) + "'");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]);
    const Value b = eval(*e.args[1]);
    const int line = e.line;
    if (op == "~") {
      std::string s = to_str(a) + to_str(b);
      if (s.size() > lim_.max_output) fail(line, "string too long");
      return Value::str(std::move(s));
    }
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") {
      const bool r = contains(b, a, line);
      return Value::boolean(op == "in" ? r : !r);
    }
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c;
      if (numeric(a) && numeric(b)) {
        const double x = num(a), y = num(b);
        c = x < y ? -1 : x > y ? 1 : 0;
      } else if (a.kind == Value::Str && b.kind == Value::Str) {
        c = a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
      } else {
        operand_error(op, a, b, line);
      }
      const bool r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
      return Value::boolean(r);
    }
    if (op == "+") {
      if (std::optional<Value> r = concat(a, b, line)) return std::move(*r);
    }
    if (op == "*") {
      if (std::optional<Value> r = repeat(a, b, line)) return std::move(*r);
    }
    return arithmetic(op, a, b, line);
  }

  // `a in b`: a substring of a string, an item of a list, a key of a mapping; nothing is in undefined.
  bool contains(const Value& b, const Value& a, int line) {
    if (b.kind == Value::ListK) work(b.list->size(), line);
    if (b.kind == Value::Str) work(b.s.size() / 64, line);
    bool r = false;
    if (b.kind == Value::Str) {
      if (a.kind != Value::Str) fail(line, "'in <string>' requires a string on the left");
      r = find_sub(b.s, a.s) != std::string::npos;
    } else if (b.kind == Value::ListK) {
      for (size_t k = 0; k < b.list->size() && !r; ++k) r = equal(a, (*b.list)[k]);
    } else if (b.kind == Value::DictK) {
      r = a.kind == Value::Str && b.find(a.s) != nullptr;
    } else if (b.kind == Value::Undefined) {
      r = false;
    } else {
      fail(line, std::string("argument of type '") + kind_name(b) + "' is not iterable");
    }
    return r;
  }

  // `+` of two strings or two lists; nothing (numbers follow) otherwise.
  std::optional<Value> concat(const Value& a, const Value& b, int line) {
    if (a.kind == Value::Str && b.kind == Value::Str) {
      if (a.s.size() + b.s.size() > lim_.max_output) fail(line, "string too long");
      afford(a.s.size() + b.s.size(), line);
      return Value::str(a.s + b.s);
    }
    if (a.kind == Value::ListK && b.kind == Value::ListK) {
      if (a.list->size() + b.list->size() > lim_.max_items) fail(line, "list too long");
      charge(items_bytes(*a.list) + items_bytes(*b.list) - (a.list->size() + b.list->size()) * sizeof(Value), line);
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::new_list(std::move(l));
    }
    return std::nullopt;
  }

  // `*` of a string or list and an integer (either side); nothing (numbers follow) otherwise.
  std::optional<Value> repeat(const Value& a, const Value& b, int line) {
    const Value* seq = a.kind == Value::Str || a.kind == Value::ListK ? &a : &b;
    const Value* times = seq == &a ? &b : &a;
    if (!(seq->kind == Value::Str || seq->kind == Value::ListK) ||
        !(times->kind == Value::Int || times->kind == Value::Bool))
      return std::nullopt;
    const int64_t n = std::max<int64_t>(0, times->kind == Value::Int ? times->i : times->b);
    const size_t unit = seq->kind == Value::Str ? seq->s.size() : seq->list->size();
    if (n > 0 && unit > 0 && uint64_t(n) > lim_.max_items / unit) fail(line, "repetition too long");
    // Bytes of the result: the string, or the list's slots and the strings copied into them.
    // (n <= max_items / unit: no overflow.)
    const uint64_t unit_bytes = seq->kind == Value::Str ? seq->s.size() : items_bytes(*seq->list);
    afford(uint64_t(n) * unit_bytes, line);
    // eval() charges the new list's slots; the strings copied into them are charged here.
    if (seq->kind == Value::ListK) charge(uint64_t(n) * (unit_bytes - unit * sizeof(Value)), line);
    if (seq->kind == Value::Str) {
      std::string s;
      for (int64_t k = 0; k < n; ++k) s += seq->s;
      return Value::str(std::move(s));
    }
    List l;
    for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq->list->begin(), seq->list->end());
    return Value::new_list(std::move(l));
  }

  // + - * / // % ** on numbers (bools count as 0/1): Python's integer semantics, overflow an error.
  static Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
    if (!numeric(a) || !numeric(b)) operand_error(op, a, b, line);
    const bool ints = a.kind != Value::Float && b.kind != Value::Float;
    const int64_t x = a.kind == Value::Int ? a.i : a.kind == Value::Bool ? a.b : 0;
    const int64_t y = b.kind == Value::Int ? b.i : b.kind == Value::Bool ? b.b : 0;
    int64_t r = 0;
    if (op == "+" || op == "-" || op == "*") {
      if (ints) {
        const bool over = op == "+"   ? __builtin_add_overflow(x, y, &r)
                          : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                      : __builtin_mul_overflow(x, y, &r);
        if (over) fail(line, "integer overflow");
        return Value::integer(r);
      }
      const double u = num(a), v = num(b);
      return Value::real(op == "+" ? u + v : op == "-" ? u - v : u * v);
    }
    if (op == "/") {
      if (num(b) == 0) fail(line, "division by zero");
      return Value::real(num(a) / num(b));
    }
    if (op == "//" || op == "%") {
      if (num(b) == 0) fail(line, op == "%" ? "modulo by zero" : "division by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) fail(line, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::integer(op == "//" ? q : m);
      }
      const double u = num(a), v = num(b);
      const double q = std::floor(u / v);
      return Value::real(op == "//" ? q : u - q * v);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t p = 1;
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(p, x, &p)) fail(line, "integer overflow");
          if (p == 0 || p == 1) break;
        }
        return Value::integer(p);
      }
      return Value::real(std::pow(num(a), num(b)));
    }
    operand_error(op, a, b, line);
  }

  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Value::Undefined)
      fail(line, "'" + (obj.s.empty() ? std::string("value") : obj.s) + "' is undefined (reading ." + name + ")");
    if (obj.kind == Value::DictK || obj.kind == Value::Namespace) {
      if (const Value* v = obj.find(name)) return *v;
      return Value::undefined(name);
    }
    if (obj.kind == Value::ListK && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
      return subscript(obj, Value::integer(std::stoll(name)), line);
    return Value::undefined(name);
  }

  Value subscript(const Value& obj, const Value& key, int line) {
    if (obj.kind == Value::Undefined)
      fail(line, "'" + (obj.s.empty() ? std::string("value") : obj.s) + "' is undefined (subscripted)");
    if (obj.kind == Value::DictK || obj.kind == Value::Namespace) {
      if (key.kind == Value::Str)
        if (const Value* v = obj.find(key.s)) return *v;
      return Value::undefined(key.kind == Value::Str ? key.s : "");
    }
    if (obj.kind == Value::ListK || obj.kind == Value::Str) {
      if (key.kind != Value::Int && key.kind != Value::Bool) {
        if (key.kind == Value::Str) return Value::undefined(key.s);
        fail(line, "indices must be integers");
      }
      int64_t k = key.kind == Value::Int ? key.i : key.b;
      if (obj.kind == Value::ListK) {
        const int64_t n = int64_t(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined("");
        return (*obj.list)[size_t(k)];
      }
      const auto cps = code_points(obj.s);
      const int64_t n = int64_t(cps.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined("");
      return Value::str(cps[size_t(k)]);
    }
    return Value::undefined("");
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    int64_t idx[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[size_t(k) + 1]) continue;
      const Value v = eval(*e.args[size_t(k) + 1]);
      if (v.kind == Value::None) continue;
      if (v.kind != Value::Int) fail(e.line, "slice indices must be integers");
      idx[k] = v.i;
      given[k] = true;
    }
    const int64_t step = idx[2];
    if (step == 0) fail(e.line, "slice step cannot be zero");
    List items;
    std::vector<std::string> cps;
    int64_t n;
    if (obj.kind == Value::ListK) {
      n = int64_t(obj.list->size());
    } else if (obj.kind == Value::Str) {
      cps = code_points(obj.s);
      n = int64_t(cps.size());
    } else {
      fail(e.line, std::string("'") + kind_name(obj) + "' cannot be sliced");
    }
    auto norm = [&](int64_t v, bool has, int64_t dflt) {
      if (!has) return dflt;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = norm(idx[0], given[0], step > 0 ? 0 : n - 1);
    const int64_t stop = norm(idx[1], given[1], step > 0 ? n : -1);
    std::vector<int64_t> picks;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) picks.push_back(k);
    if (obj.kind == Value::ListK) {
      for (int64_t k : picks) items.push_back((*obj.list)[size_t(k)]);
      return Value::new_list(std::move(items));
    }
    std::string s;
    for (int64_t k : picks) s += cps[size_t(k)];
    return Value::str(std::move(s));
  }

  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value* get(size_t i, const char* name) const {
      if (i < pos.size()) return &pos[i];
      for (const auto& [k, v] : kw)
        if (k == name) return &v;
      return nullptr;
    }
  };
  Args args_of(const Expr& e, size_t skip) {
    Args a;
    for (size_t k = skip; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k]));
    for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
    return a;
  }
  static std::string str_arg(const Args& a, size_t i, const char* name, int line, const std::string& dflt = "",
                             bool required = true) {
    const Value* v = a.get(i, name);
    if (!v) {
      if (required) fail(line, std::string("missing argument '") + name + "'");
      return dflt;
    }
    if (v->kind != Value::Str) fail(line, std::string("argument '") + name + "' must be a string");
    return v->s;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Name) {
      Args a = args_of(e, 1);
      const std::string& f = callee.name;
      if (f == "raise_exception") {
        const Value* m = a.get(0, "message");
        throw RenderError(m ? to_str(*m) : std::string("raise_exception()"));
      }
      if (f == "namespace" || f == "dict") {
        Value ns = Value::new_dict({}, f == "namespace" ? Value::Namespace : Value::DictK);
        for (auto& [k, v] : a.kw) ns.set_item(k, v);
        return ns;
      }
      if (f == "range") {
        int64_t r[3] = {0, 0, 1};
        for (const Value& v : a.pos)
          if (v.kind != Value::Int) fail(e.line, "range() takes integers");
        if (a.pos.size() == 1) r[1] = a.pos[0].i;
        if (a.pos.size() >= 2) r[0] = a.pos[0].i, r[1] = a.pos[1].i;
        if (a.pos.size() == 3) r[2] = a.pos[2].i;
        if (a.pos.empty() || a.pos.size() > 3) fail(e.line, "range() takes 1 to 3 arguments");
        if (r[2] == 0) fail(e.line, "range() step must not be zero");
        const long double count = std::max<long double>(0, std::ceil(((long double)r[1] - r[0]) / r[2]));
        if (count > lim_.max_items) fail(e.line, "range() too long");
        afford(uint64_t(count) * sizeof(Value), e.line);
        List l;
        for (int64_t k = r[0]; r[2] > 0 ? k < r[1] : k > r[1]; k += r[2]) {
          if (l.size() >= lim_.max_items) fail(e.line, "range() too long");
          l.push_back(Value::integer(k));
        }
        return Value::new_list(std::move(l));
      }
      if (f == "strftime_now") {
        const std::string fmt = str_arg(a, 0, "format", e.line);
        if (fmt.size() > 256) fail(e.line, "strftime_now format too long");
        std::tm tm{};
        gmtime_r(&now_, &tm);
        char buf[1024];
        const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
        return Value::str(std::string(buf, n));
      }
      fail(e.line, "unknown function '" + f + "'");
    }
    if (callee.kind != Expr::Attr) fail(e.line, "only functions and methods can be called");
    const Value obj = eval(*callee.args[0]);
    Args a = args_of(e, 1);
    return method(obj, callee.name, a, e.line);
  }

  Value method(const Value& obj, const std::string& m, const Args& a, int line) {
    if (obj.kind == Value::Str) {
      if (std::optional<Value> r = string_method(obj.s, m, a, line)) return std::move(*r);
    }
    if (obj.kind == Value::DictK) {
      if (m == "items" || m == "keys" || m == "values") {
        List l;
        for (const auto& [k, v] : *obj.dict) {
          if (m == "items") {
            l.push_back(Value::new_list({Value::str(k), v}));
            l.back().tuple = true;
          }
          if (m == "keys") l.push_back(Value::str(k));
          if (m == "values") l.push_back(v);
        }
        return Value::new_list(std::move(l));
      }
      if (m == "get") {
        const Value* k = a.get(0, "key");
        if (!k) fail(line, "get() takes a key");
        if (k->kind == Value::Str)
          if (const Value* v = obj.find(k->s)) return *v;
        const Value* d = a.get(1, "default");
        return d ? *d : Value::none();
      }
    }
    if (obj.kind == Value::ListK && (m == "index" || m == "count")) {
      const Value* x = a.get(0, "value");
      if (!x) fail(line, m + "() takes an argument");
      int64_t n = 0;
      work(obj.list->size(), line);
      for (size_t k = 0; k < obj.list->size(); ++k) {
        if (!equal((*obj.list)[k], *x)) continue;
        if (m == "index") return Value::integer(int64_t(k));
        ++n;
      }
      if (m == "index") fail(line, "value not in list");
      return Value::integer(n);
    }
    if (obj.kind == Value::Undefined) fail(line, "'" + obj.s + "' is undefined (calling ." + m + "())");
    fail(line, std::string("'") + kind_name(obj) + "' has no method '" + m + "'");
  }

  // Python's str methods that templates call.
  std::optional<Value> string_method(const std::string& s, const std::string& m, const Args& a, int line) {
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      const Value* chars = a.get(0, "chars");
      return Value::str(py_strip(s, m != "rstrip", m != "lstrip", chars));
    }
    if (m == "upper" || m == "lower") return Value::str(ascii_case(s, m == "upper"));
    if (m == "startswith" || m == "endswith") {
      const Value* p = a.get(0, "prefix");
      if (!p) fail(line, m + "() takes an argument");
      List cands = p->kind == Value::ListK ? *p->list : List{*p};
      for (const Value& c : cands) {
        if (c.kind != Value::Str) fail(line, m + "() takes strings");
        const bool hit = m == "startswith"
                             ? s.compare(0, c.s.size(), c.s) == 0 && s.size() >= c.s.size()
                             : s.size() >= c.s.size() && s.compare(s.size() - c.s.size(), c.s.size(), c.s) == 0;
        if (hit) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (m == "split" || m == "rsplit") return split(s, a, m == "rsplit", line);
    if (m == "splitlines") {
      List l;
      size_t p = 0;
      while (p < s.size()) {
        size_t q = s.find_first_of("\r\n", p);
        if (q == std::string::npos) {
          l.push_back(Value::str(s.substr(p)));
          break;
        }
        l.push_back(Value::str(s.substr(p, q - p)));
        p = q + (s[q] == '\r' && q + 1 < s.size() && s[q + 1] == '\n' ? 2 : 1);
      }
      return Value::new_list(std::move(l));
    }
    if (m == "replace") return replace(s, a, line);
    if (m == "title" || m == "capitalize") return Value::str(case_words(s, m == "title"));
    if (m == "find" || m == "index") {
      const size_t f = find_sub(s, str_arg(a, 0, "sub", line));
      if (f == std::string::npos) {
        if (m == "index") fail(line, "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(int64_t(cp_count(s.substr(0, f))));
    }
    if (m == "count") {
      const std::string sub = str_arg(a, 0, "sub", line);
      if (sub.empty()) return Value::integer(int64_t(cp_count(s)) + 1);
      int64_t n = 0;
      for (size_t p = find_sub(s, sub); p != std::string::npos; p = find_sub(s, sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    if (m == "isdigit" || m == "isspace" || m == "isalpha") {
      if (s.empty()) return Value::boolean(false);
      for (const auto& c : code_points(s)) {
        const uint32_t cp = decode_cp(c);
        const bool ok = m == "isdigit"   ? (cp >= '0' && cp <= '9')
                        : m == "isspace" ? py_space(cp)
                                         : ((cp | 32) >= 'a' && (cp | 32) <= 'z');
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    }
    if (m == "join") {
      const Value* it = a.get(0, "iterable");
      if (!it) fail(line, "join() takes an argument");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(*it, line)) {
        if (x.kind != Value::Str) fail(line, "join() takes strings");
        if (!first) out += s;
        first = false;
        out += x.s;
        if (out.size() > lim_.max_output) fail(line, "string too long");
      }
      return Value::str(std::move(out));
    }
    return std::nullopt;
  }

  // str.replace(old, new[, count]), the method and the filter.
  Value replace(const std::string& s, const Args& a, int line) const {
    const Value* c = a.get(2, "count");
    return Value::str(replace_all(s, str_arg(a, 0, "old", line), str_arg(a, 1, "new", line),
                                  c && c->kind == Value::Int ? c->i : -1, lim_.max_output));
  }

  static std::string case_words(const std::string& s, bool title) {
    std::string out = s;
    bool start = true;
    for (char& c : out) {
      const bool alpha = (c | 32) >= 'a' && (c | 32) <= 'z';
      if (alpha) {
        c = start ? char(c >= 'a' && c <= 'z' ? c - 32 : c) : char(c >= 'A' && c <= 'Z' ? c + 32 : c);
        start = false;
      } else if (title) {
        start = !(static_cast<unsigned char>(c) >= 0x80 || (c >= '0' && c <= '9'));
      }
    }
    return out;
  }

  Value split(const std::string& s, const Args& a, bool right, int line) {
    const Value* sep = a.get(0, "sep");
    const Value* mx = a.get(1, "maxsplit");
    int64_t maxsplit = mx && mx->kind == Value::Int ? mx->i : -1;
    List l;
    if (!sep || sep->kind == Value::None) {  // runs of whitespace, no empty strings
      std::vector<std::string> words;
      std::string cur;
      bool in = false;
      const auto cps = code_points(s);
      // maxsplit with whitespace splitting: only from the left is supported exactly
      int64_t splits = 0;
      size_t k = 0;
      for (; k < cps.size(); ++k) {
        const bool sp = py_space(decode_cp(cps[k]));
        if (sp && in) {
          words.push_back(cur);
          cur.clear();
          in = false;
          if (!right && maxsplit >= 0 && ++splits >= maxsplit) break;
        } else if (!sp) {
          cur += cps[k];
          in = true;
        }
      }
      if (in) words.push_back(cur);
      if (k < cps.size()) {  // the rest after maxsplit, leading whitespace dropped
        std::string rest;
        for (++k; k < cps.size(); ++k) rest += cps[k];
        rest = py_strip(rest, true, false, nullptr);
        if (!rest.empty()) words.push_back(rest);
      }
      for (auto& w : words) l.push_back(Value::str(w));
      return Value::new_list(std::move(l));
    }
    if (sep->kind != Value::Str) fail(line, "split() separator must be a string");
    const std::string& d = sep->s;
    if (d.empty()) fail(line, "empty separator");
    std::vector<std::string> parts;
    if (!right) {
      size_t p = 0;
      int64_t n = 0;
      while (maxsplit < 0 || n < maxsplit) {
        const size_t f = find_sub(s, d, p);
        if (f == std::string::npos) break;
        parts.push_back(s.substr(p, f - p));
        p = f + d.size();
        ++n;
      }
      parts.push_back(s.substr(p));
    } else {
      // rfind is quadratic at worst (no linear reverse search here): counted as steps.
      work(s.size() / 16 * (d.size() / 16 + 1), line);
      size_t end = s.size();
      int64_t n = 0;
      std::vector<std::string> rev;
      while (maxsplit < 0 || n < maxsplit) {
        if (end < d.size()) break;
        const size_t f = s.rfind(d, end - d.size());
        if (f == std::string::npos) break;
        rev.push_back(s.substr(f + d.size(), end - f - d.size()));
        end = f;
        ++n;
      }
      rev.push_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
    for (auto& w : parts) l.push_back(Value::str(w));
    return Value::new_list(std::move(l));
  }

  // A filter evaluates its subject and arguments, then the first group that knows the name applies it.
  Value filter(const Expr& e) {
    const std::string& f = e.name;
    const Value v = eval(*e.args[0]);
    Args a = args_of(e, 1);
    const int line = e.line;
    if (std::optional<Value> r = value_filter(f, v, a, line)) return std::move(*r);
    if (std::optional<Value> r = sequence_filter(f, v, a, line)) return std::move(*r);
    if (std::optional<Value> r = string_filter(f, v, a, line)) return std::move(*r);
    if (std::optional<Value> r = number_filter(f, v, a, line)) return std::move(*r);
    fail(line, "filter '" + f + "' is not implemented");
  }

  // default, safe, string, tojson: filters on any value.
  std::optional<Value> value_filter(const std::string& f, const Value& v, const Args& a, int line) {
    if (f == "default" || f == "d") {
      const Value* bool_kw = a.get(1, "boolean");
      const bool by_truth = bool_kw && bool_kw->truthy();
      if (v.is_undefined() || (by_truth && !v.truthy())) {
        const Value* d = a.get(0, "default_value");
        return d ? *d : Value::str("");
      }
      return v;
    }
    if (f == "safe") return v;
    if (f == "string") return Value::str(to_str(v));
    if (f == "tojson") {
      const Value* ind = a.get(0, "indent");
      const Value* sk = a.get(1, "sort_keys");
      int indent = -1;
      if (ind && ind->kind == Value::Int) indent = int(std::clamp<int64_t>(ind->i, 0, 64));
      std::string s = to_json(v, indent, sk && sk->truthy());
      if (s.size() > lim_.max_output) fail(line, "tojson output too long");
      return Value::str(std::move(s));
    }
    return std::nullopt;
  }

  // Filters over a sequence (or a string or mapping taken as one).
  std::optional<Value> sequence_filter(const std::string& f, const Value& v, const Args& a, int line) {
    if (f == "length" || f == "count") return length_of(v, line);
    if (f == "list") return Value::new_list(iterate(v, line));
    if (f == "items") {
      if (v.kind == Value::Undefined) return Value::new_list();
      if (v.kind != Value::DictK) fail(line, "items filter needs a mapping");
      return method(v, "items", {}, line);
    }
    if (f == "first" || f == "last") {
      const List l = iterate(v, line);
      if (l.empty()) return Value::undefined(f);
      return f == "first" ? l.front() : l.back();
    }
    if (f == "reverse") return reversed(v, line);
    if (f == "unique") return unique(v, a, line);
    if (f == "join") return join(v, a, line);
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") return select_items(f, v, a, line);
    if (f == "map") return map_items(v, a, line);
    if (f == "sum") return sum(iterate(v, line), line);
    if (f == "min" || f == "max") return extreme(f, iterate(v, line), line);
    return std::nullopt;
  }

  // jinja2's unique: the first of each group of equal items, strings compared ignoring case unless
  // case_sensitive; items must be hashable (no lists or dicts), 1 == 1.0 == true as in Python.
  Value unique(const Value& v, const Args& a, int line) {
    const Value* cs = a.get(0, "case_sensitive");
    const bool case_sensitive = cs && cs->truthy();
    const Value* attr = a.get(1, "attribute");
    std::unordered_set<std::string> seen;
    List out;
    for (const Value& x : iterate(v, line)) {
      const Value k = attr ? attribute_soft(x, to_str(*attr)) : x;
      std::string key;
      switch (k.kind) {
        case Value::Str:
          key = "s" + (case_sensitive ? k.s : ascii_case(k.s, false));
          break;
        case Value::Int:
        case Value::Bool:
        case Value::Float: {
          const double d = num(k);
          key = k.kind != Value::Float || (std::floor(d) == d && std::fabs(d) < 9e18) ? "n" + std::to_string(int64_t(d))
                                                                                     : "f" + repr(k);
          break;
        }
        case Value::BigInt:
          key = "n" + k.s;
          break;
        case Value::None:
        case Value::Undefined:
          key = "N";
          break;
        default:
          fail(line, std::string("unhashable type: '") + kind_name(k) + "'");
      }
      if (seen.insert(std::move(key)).second) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }

  Value length_of(const Value& v, int line) {
    switch (v.kind) {
      case Value::Str:
        return Value::integer(int64_t(cp_count(v.s)));
      case Value::ListK:
        return Value::integer(int64_t(v.list->size()));
      case Value::DictK:
        return Value::integer(int64_t(v.dict->size()));
      case Value::Undefined:
        return Value::integer(0);
      default:
        fail(line, std::string("object of type '") + kind_name(v) + "' has no len()");
    }
  }

  Value reversed(const Value& v, int line) {
    if (v.kind == Value::Str) {
      auto cps = code_points(v.s);
      std::string s;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) s += *it;
      return Value::str(s);
    }
    List l = iterate(v, line);
    std::reverse(l.begin(), l.end());
    return Value::new_list(std::move(l));
  }

  Value join(const Value& v, const Args& a, int line) {
    const std::string sep = str_arg(a, 0, "d", line, "", false);
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& x0 : iterate(v, line)) {
      const Value x = attr ? attribute(x0, to_str(*attr), line) : x0;
      if (!first) out += sep;
      first = false;
      out += to_str(x);
      if (out.size() > lim_.max_output) fail(line, "string too long");
    }
    return Value::str(std::move(out));
  }

  // select/reject keep the items a test passes/fails; the *attr forms test one attribute of each item.
  Value select_items(const std::string& f, const Value& v, const Args& a, int line) {
    const bool by_attr = f == "selectattr" || f == "rejectattr";
    const bool keep_if = f == "selectattr" || f == "select";
    size_t k = 0;
    std::string attr;
    if (by_attr) attr = str_arg(a, k++, "attribute", line);
    const Value* tname = a.get(k, "test");
    List out;
    for (const Value& x : iterate(v, line)) {
      const Value subject = by_attr ? attribute_soft(x, attr) : x;
      bool r;
      if (!tname) {
        r = subject.truthy();
      } else {
        if (tname->kind != Value::Str) fail(line, "test name must be a string");
        std::vector<Value> targs(a.pos.begin() + std::min(a.pos.size(), k + 1), a.pos.end());
        r = run_test(tname->s, subject, targs, line);
      }
      if (r == keep_if) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }

  // map(attribute=..., default=...) or map('filter') for the few filters templates map with.
  Value map_items(const Value& v, const Args& a, int line) {
    const Value* attr = a.get(99, "attribute");
    List out;
    for (const Value& x : iterate(v, line)) {
      if (attr) {
        Value y = attribute_soft(x, to_str(*attr));
        if (y.is_undefined()) {
          const Value* d = a.get(99, "default");
          if (d) y = *d;
        }
        out.push_back(y);
        continue;
      }
      const std::string fn = str_arg(a, 0, "filter", line);
      if (fn == "string") {
        out.push_back(Value::str(to_str(x)));
      } else if (fn == "lower" || fn == "upper") {
        out.push_back(Value::str(ascii_case(to_str(x), fn == "upper")));
      } else if (fn == "trim") {
        out.push_back(Value::str(py_strip(to_str(x), true, true, nullptr)));
      } else if (fn == "tojson") {
        out.push_back(Value::str(to_json(x)));
      } else {
        fail(line, "map('" + fn + "') is not supported");
      }
    }
    return Value::new_list(std::move(out));
  }

  static Value sum(const List& l, int line) {
    Value acc = Value::integer(0);
    for (const Value& x : l) {
      if (!numeric(x)) fail(line, "sum() needs numbers");
      if (acc.kind == Value::Int && x.kind != Value::Float) {
        int64_t r;
        if (__builtin_add_overflow(acc.i, x.kind == Value::Int ? x.i : int64_t(x.b), &r))
          fail(line, "integer overflow");
        acc.i = r;
      } else {
        acc = Value::real(num(acc) + num(x));
      }
    }
    return acc;
  }

  // min/max: the first of the least/greatest items, numbers with numbers and strings with strings.
  static Value extreme(const std::string& f, const List& l, int line) {
    if (l.empty()) return Value::undefined(f);
    Value best = l[0];
    for (const Value& x : l) {
      bool less;
      if (numeric(x) && numeric(best)) {
        less = num(x) < num(best);
      } else if (x.kind == Value::Str && best.kind == Value::Str) {
        less = x.s < best.s;
      } else {
        fail(line, f + "() of values that do not compare");
      }
      const bool greater = !less && !equal(x, best);
      if ((f == "min" && less) || (f == "max" && greater)) best = x;
    }
    return best;
  }

  // Filters that take the subject as a string.
  std::optional<Value> string_filter(const std::string& f, const Value& v, const Args& a, int line) {
    if (f == "trim") return Value::str(py_strip(to_str(v), true, true, a.get(0, "chars")));
    if (f == "upper" || f == "lower") return Value::str(ascii_case(to_str(v), f == "upper"));
    if (f == "capitalize" || f == "title")
      return Value::str(case_words(f == "capitalize" ? ascii_case(to_str(v), false) : to_str(v), f == "title"));
    if (f == "replace") return replace(to_str(v), a, line);
    if (f == "e" || f == "escape") return Value::str(html_escape(to_str(v)));
    return std::nullopt;
  }

  static std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    return out;
  }

  // int, float, bool, abs: conversions and arithmetic.
  static std::optional<Value> number_filter(const std::string& f, const Value& v, const Args& a, int line) {
    if (f == "int") return to_int(v, a);
    if (f == "float") {
      if (v.is_number() || v.kind == Value::Bool) return Value::real(num(v));
      if (v.kind == Value::Str) {
        if (std::optional<double> d = py_float(v.s)) return Value::real(*d);
      }
      const Value* d = a.get(0, "default");
      return d ? *d : Value::real(0);
    }
    if (f == "bool") return Value::boolean(v.truthy());
    if (f == "abs") {
      if (v.kind == Value::Int) {
        if (v.i == INT64_MIN) fail(line, "integer overflow");
        return Value::integer(v.i < 0 ? -v.i : v.i);
      }
      if (v.kind == Value::Float) return Value::real(std::fabs(v.f));
      fail(line, "abs() needs a number");
    }
    return std::nullopt;
  }

  static Value to_int(const Value& v, const Args& a) {
    if (v.kind == Value::Int) return v;
    if (v.kind == Value::Float && std::isfinite(v.f) && std::fabs(v.f) < 9e18) return Value::integer(int64_t(v.f));
    if (v.kind == Value::Bool) return Value::integer(v.b);
    if (v.kind == Value::Str) {
      try {
        size_t used = 0;
        const std::string t = py_strip(v.s, true, true, nullptr);
        const long long x = std::stoll(t, &used);
        if (used == t.size()) return Value::integer(x);
      } catch (const std::exception&) {
      }
    }
    const Value* d = a.get(0, "default");
    return d ? *d : Value::integer(0);
  }

  // Jinja's attribute lookup for selectattr/map: undefined instead of an error.
  static Value attribute_soft(const Value& obj, const std::string& name) {
    if (obj.kind == Value::DictK || obj.kind == Value::Namespace) {
      if (const Value* v = obj.find(name)) return *v;
    }
    return Value::undefined(name);
  }

  bool test(const Expr& e) {
    const Value v = eval(*e.args[0]);
    std::vector<Value> a;
    for (size_t k = 1; k < e.args.size(); ++k) a.push_back(eval(*e.args[k]));
    return run_test(e.name, v, a, e.line);
  }

  bool run_test(const std::string& t, const Value& v, const std::vector<Value>& a, int line) {
    auto arg = [&](size_t i) -> const Value& {
      if (i >= a.size()) fail(line, "test '" + t + "' needs an argument");
      return a[i];
    };
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.kind == Value::None;
    if (t == "string") return v.kind == Value::Str;
    if (t == "mapping") return v.kind == Value::DictK;
    if (t == "iterable") return v.kind == Value::Str || v.kind == Value::ListK || v.kind == Value::DictK;
    if (t == "sequence") return v.kind == Value::Str || v.kind == Value::ListK || v.kind == Value::DictK;
    if (t == "number") return v.is_number() || v.kind == Value::Bool || v.kind == Value::BigInt;
    if (t == "integer") return v.kind == Value::Int || v.kind == Value::BigInt;
    if (t == "float") return v.kind == Value::Float;
    if (t == "boolean") return v.kind == Value::Bool;
    if (t == "true") return v.kind == Value::Bool && v.b;
    if (t == "false") return v.kind == Value::Bool && !v.b;
    if (t == "callable") return false;
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return equal(v, arg(0));
    if (t == "ne" || t == "!=") return !equal(v, arg(0));
    if (t == "lower") return v.kind == Value::Str && ascii_case(v.s, false) == v.s;
    if (t == "upper") return v.kind == Value::Str && ascii_case(v.s, true) == v.s;
    if (t == "odd" || t == "even" || t == "divisibleby") {
      if (v.kind != Value::Int) fail(line, "test '" + t + "' needs an integer");
      if (t == "odd") return v.i % 2 != 0;
      if (t == "even") return v.i % 2 == 0;
      const Value& d = arg(0);
      if (d.kind != Value::Int || d.i == 0) fail(line, "divisibleby needs a non-zero integer");
      return v.i % d.i == 0;
    }
    if (t == "in") {
      const Value& c = arg(0);
      if (c.kind == Value::Str) return v.kind == Value::Str && find_sub(c.s, v.s) != std::string::npos;
      if (c.kind == Value::ListK) {
        for (const Value& x : *c.list)
          if (equal(v, x)) return true;
        return false;
      }
      if (c.kind == Value::DictK) return v.kind == Value::Str && c.find(v.s);
      return false;
    }
    fail(line, "test '" + t + "' is not implemented");
  }
};

bool uses_generation(const Body& b) {
  for (const NodeP& n : b) {
    if (n->kind == Node::Generation) return true;
    for (const auto& br : n->branches)
      if (uses_generation(br.second)) return true;
    if (uses_generation(n->body) || uses_generation(n->else_body)) return true;
  }
  return false;
}

}  // namespace

Template Template::parse(const std::string& source, const LexOptions& opt) {
  Template t;
  t.body_ = parse_template(source, opt);
  t.has_generation_ = uses_generation(t.body_);
  return t;
}

Rendered Template::render(const Dict& vars, std::time_t now, const RenderLimits& limits) const {
  Renderer r(vars, now, limits);
  try {
    r.exec(body_);
  } catch (const RenderError& e) {
    // Errors raised by the values (nesting) or by raise_exception carry no line yet.
    const std::string what = e.what();
    if (what.rfind("line ", 0) == 0) throw;
    throw RenderError("line " + std::to_string(r.last_line()) + ": " + what);
  }
  r.out.steps = r.steps();
  return std::move(r.out);
}

}  // namespace sf::jinja
