// Jinja's lexing as jinja2 does it for the default delimiters: {{ }}, {% %}, {# #}; `-` at a
// delimiter strips the whitespace on that side; trim_blocks drops the first newline after a block
// tag or comment; lstrip_blocks drops spaces and tabs between the start of a line and a block tag or
// comment (not after `{%+`).
#include <cctype>

#include "data/template/jinja_ast.h"
#include "data/tokenizer/unicode.h"

namespace sf::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int count_lines(const std::string& s, size_t from, size_t to) {
  int n = 0;
  for (size_t i = from; i < to && i < s.size(); ++i) n += s[i] == '\n';
  return n;
}

}  // namespace

std::vector<Segment> split_template(const std::string& src, const LexOptions& opt) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false;    // the previous tag ended with `-`
  bool trim_next = false;     // the previous tag was a block or comment (trim_blocks)
  bool line_starting = true;  // what jinja2 consumed last ended a line (lstrip_blocks applies)
  while (pos <= src.size()) {
    size_t open = pos;
    while (true) {
      open = src.find('{', open);
      if (open == std::string::npos || open + 1 >= src.size()) {
        open = std::string::npos;
        break;
      }
      const char c = src[open + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++open;
    }
    std::string text = src.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    const int text_line = line;
    line += count_lines(src, pos, open == std::string::npos ? src.size() : open);
    if (pos > 0) line_starting = false;
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_ws(text[k])) ++k;
      line_starting = k > 0 && text[k - 1] == '\n';
      text.erase(0, k);
    } else if (trim_next && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      line_starting = true;
    } else if (trim_next && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
      text.erase(0, 2);
      line_starting = true;
    }
    strip_next = trim_next = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Segment::Text, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    size_t p = open + 2;
    const char mod = p < src.size() ? src[p] : 0;
    if (mod == '-') {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
      ++p;
    } else if (mod == '+') {
      ++p;
    } else if (opt.lstrip_blocks && (kind == '%' || kind == '#')) {
      const size_t nl = text.find_last_of('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      bool blank = true;
      for (size_t k = from; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
      // At the start of the template the "line" starts at the template's start, as in jinja2.
      if (blank && (nl != std::string::npos || line_starting)) text.erase(from);
    }
    if (!text.empty()) out.push_back({Segment::Text, text, text_line});
    const int tag_line = line;
    // The end of the tag: outside string literals (comments: the first `#}`).
    const char close = kind == '{' ? '}' : kind == '%' ? '%' : '#';
    size_t end = std::string::npos;
    char quote = 0;
    for (size_t k = p; k + 1 < src.size(); ++k) {
      const char c = src[k];
      if (kind != '#' && quote) {
        if (c == '\\') {
          ++k;
        } else if (c == quote) {
          quote = 0;
        }
        continue;
      }
      if (kind != '#' && (c == '\'' || c == '"')) {
        quote = c;
        continue;
      }
      if (c == close && src[k + 1] == '}') {
        end = k;
        break;
      }
    }
    if (end == std::string::npos) throw SyntaxError(tag_line, std::string("unclosed '{") + kind + "' tag");
    size_t inner_end = end;
    if (inner_end > p && src[inner_end - 1] == '-') {
      strip_next = true;
      --inner_end;
    }
    line += count_lines(src, open, end + 2);
    if (kind != '#')
      out.push_back({kind == '{' ? Segment::Var : Segment::Block, src.substr(p, inner_end - p), tag_line});
    if (kind != '{' && opt.trim_blocks) trim_next = true;
    pos = end + 2;
  }
  return out;
}

namespace {

bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// The number at s[i]: digits with `_` separators, an optional fraction and exponent. Returns the
// index after it.
size_t lex_number(const std::string& s, size_t i, int line, std::vector<Token>& out) {
  size_t j = i;
  bool real = false;
  while (j < s.size() && (is_digit(s[j]) || s[j] == '_')) ++j;
  if (j + 1 < s.size() && s[j] == '.' && is_digit(s[j + 1])) {
    real = true;
    ++j;
    while (j < s.size() && is_digit(s[j])) ++j;
  }
  if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
    size_t k = j + 1;
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
    if (k < s.size() && is_digit(s[k])) {
      real = true;
      j = k;
      while (j < s.size() && is_digit(s[j])) ++j;
    }
  }
  std::string num;
  for (size_t k = i; k < j; ++k)
    if (s[k] != '_') num += s[k];
  out.push_back({real ? Token::Float : Token::Int, num, line});
  return j;
}

// Appends to v what the escape whose letter is s[j] stands for, as Python reads it; \x, \u and \U
// move j onto their last hex digit.
void unescape(const std::string& s, size_t& j, int line, std::string& v) {
  const char e = s[j];
  switch (e) {
    case 'n':
      v += '\n';
      break;
    case 't':
      v += '\t';
      break;
    case 'r':
      v += '\r';
      break;
    case 'b':
      v += '\b';
      break;
    case 'f':
      v += '\f';
      break;
    case 'v':
      v += '\v';
      break;
    case 'a':
      v += '\a';
      break;
    case '0':
      v += '\0';
      break;
    case '\\':
      v += '\\';
      break;
    case '\'':
      v += '\'';
      break;
    case '"':
      v += '"';
      break;
    case '\n':
      break;
    case 'x':
    case 'u':
    case 'U': {
      const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      uint32_t cp = 0;
      for (int k = 1; k <= n; ++k) {
        if (j + k >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[j + k])))
          throw SyntaxError(line, "bad \\" + std::string(1, e) + " escape");
        const char h = s[j + k];
        cp = cp * 16 + uint32_t(is_digit(h) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      if (cp > 0x10FFFF) throw SyntaxError(line, "bad \\U escape");
      uni::append_utf8(v, cp);
      j += n;
      break;
    }
    default:  // Python keeps unknown escapes as they are
      v += '\\';
      v += e;
  }
}

// The string literal whose quote is s[i]; `line` counts the newlines inside it. Returns the index
// after the closing quote.
size_t lex_string(const std::string& s, size_t i, int& line, std::vector<Token>& out) {
  const char quote = s[i];
  std::string v;
  size_t j = i + 1;
  for (;; ++j) {
    if (j >= s.size()) throw SyntaxError(line, "unterminated string literal");
    const char d = s[j];
    if (d == quote) break;
    if (d == '\n') ++line;
    if (d != '\\') {
      v += d;
      continue;
    }
    if (++j >= s.size()) throw SyntaxError(line, "unterminated string literal");
    unescape(s, j, line, v);
  }
  out.push_back({Token::String, v, line});
  return j + 1;
}

// The operator at s[i], two characters before one; returns the index after it, or i if none.
size_t lex_op(const std::string& s, size_t i, int line, std::vector<Token>& out) {
  static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
  for (const char* t : two) {
    if (s.compare(i, 2, t) == 0) {
      out.push_back({Token::Op, t, line});
      return i + 2;
    }
  }
  if (std::string("<>+-*/%~|.,:()[]{}=").find(s[i]) != std::string::npos) {
    out.push_back({Token::Op, std::string(1, s[i]), line});
    return i + 1;
  }
  return i;
}

}  // namespace

std::vector<Token> lex_tag(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_ws(c)) {
      line += c == '\n';
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Name, s.substr(i, j - i), line});
      i = j;
    } else if (is_digit(c)) {
      i = lex_number(s, i, line, out);
    } else if (c == '\'' || c == '"') {
      i = lex_string(s, i, line, out);
    } else {
      const size_t next = lex_op(s, i, line, out);
      if (next == i) throw SyntaxError(line, std::string("unexpected character '") + c + "'");
      i = next;
    }
  }
  out.push_back({Token::End, "", line});
  return out;
}

}  // namespace sf::jinja
