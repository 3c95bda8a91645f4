#include "cli/config_file.h"

#include <cctype>
#include <map>

#include "core/error.h"
#include "io/line_reader.h"

namespace sf {

namespace {

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// "seq_len" and "seq-len" are the same option; keys are letters, digits, - and _.
std::string option_name(const std::string& key, const std::string& where) {
  if (key.empty()) input_error(where, "empty key");
  std::string k;
  for (char c : key) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-')
      input_error(where, "'" + key + "' is not an option name");
    k += c == '_' ? '-' : c;
  }
  return k;
}

// A scalar: 'single' or "double" quoted (no escapes but \" and \\ in double quotes), or bare up to a
// comment.
std::string scalar(const std::string& raw, const std::string& where) {
  const std::string v = trim(raw);
  if (v.empty()) input_error(where, "no value (nested mappings and lists are not supported)");
  if (v[0] == '"' || v[0] == '\'') {
    const char q = v[0];
    std::string out;
    size_t i = 1;
    for (; i < v.size() && v[i] != q; ++i) {
      if (q == '"' && v[i] == '\\' && i + 1 < v.size()) ++i;
      out += v[i];
    }
    if (i >= v.size()) input_error(where, "unterminated quote");
    const std::string rest = trim(v.substr(i + 1));
    if (!rest.empty() && rest[0] != '#') input_error(where, "text after the quoted value");
    return out;
  }
  const size_t hash = v.find(" #");
  const std::string out = trim(hash == std::string::npos ? v : v.substr(0, hash));
  if (out == "|" || out == ">" || out[0] == '[' || out[0] == '{' || out[0] == '&' || out[0] == '*')
    input_error(where, "only plain scalars are supported ('" + out + "')");
  return out;
}

void append(std::vector<std::string>& args, const std::string& name, const std::string& value) {
  if (value == "true" || value == "True" || value == "yes") {
    args.push_back("--" + name);
  } else if (value == "false" || value == "False" || value == "no") {
    // a flag left off
  } else {
    args.push_back("--" + name);
    args.push_back(value);
  }
}

}  // namespace

std::vector<std::string> config_to_args(const std::string& path, const std::vector<std::string>& overrides,
                                        const std::set<std::string>& given) {
  // An options file is a few hundred bytes; the limits keep /dev/zero or a huge file from being
  // buffered whole.
  constexpr size_t kMaxLineBytes = size_t(64) << 10, kMaxFileBytes = size_t(1) << 20;
  LineReader f(path, kMaxLineBytes);
  size_t total = 0;
  std::map<std::string, std::string> values;  // option -> value; later ones win
  std::vector<std::string> order;
  auto set = [&](const std::string& name, const std::string& value) {
    if (!values.count(name)) order.push_back(name);
    values[name] = value;
  };
  std::string line;
  while (f.next(line)) {
    const std::string where = path + ":" + std::to_string(f.line_number());
    total += line.size() + 1;
    if (total > kMaxFileBytes)
      input_error(where, "the config file is larger than the limit of " + std::to_string(kMaxFileBytes) + " bytes");
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t == "---") continue;
    if (std::isspace(static_cast<unsigned char>(line[0])))
      input_error(where, "indented line (nested mappings and lists are not supported)");
    if (t[0] == '-') input_error(where, "lists are not supported");
    const size_t colon = t.find(':');
    if (colon == std::string::npos) input_error(where, "expected 'key: value'");
    const std::string name = option_name(trim(t.substr(0, colon)), where);
    if (values.count(name)) input_error(where, "'" + name + "' is given twice");
    set(name, scalar(t.substr(colon + 1), where));
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) input_error(o, "expected key=value after the config file (e.g. lr=2e-5)");
    set(option_name(o.substr(0, eq), o), o.substr(eq + 1));
  }
  std::vector<std::string> args;
  for (const std::string& name : order)
    if (!given.count(name)) append(args, name, values[name]);
  return args;
}

}  // namespace sf
