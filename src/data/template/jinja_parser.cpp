// Parser of the Jinja subset: statements for/if/set/generation/break/continue, expressions with
// jinja2's precedence (conditional < or < and < not < comparisons and `in` < + - < ~ < * / // % <
// ** < unary minus < filters and tests < postfix . [] ()). Filters, tests and functions outside the
// evaluator's tables are refused here, so a template that loads has no unknown names to call.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <set>

#include "data/template/jinja_ast.h"

namespace sf::jinja {
namespace {

constexpr int kMaxDepth = 200;  // nesting of expressions and statements as written
// Depth of an expression tree: left-associative chains (`1+1+...`, `x|f|f...`, `a.b.c...`) are
// parsed by loops but evaluated (and freed) by recursion, so their length is bounded too.
constexpr int kMaxTreeDepth = 256;

const std::set<std::string>& known_filters() {
  static const std::set<std::string> s = {"trim",       "length",     "count", "tojson",  "string", "upper", "lower",
                                          "default",    "d",          "first", "last",    "items",  "join",  "replace",
                                          "selectattr", "rejectattr", "map",   "list",    "int",    "float", "abs",
                                          "capitalize", "title",      "safe",  "reverse", "unique", "e",     "escape",
                                          "select",     "reject",     "sum",   "min",     "max",    "bool"};
  return s;
}
const std::set<std::string>& known_tests() {
  static const std::set<std::string> s = {
      "defined", "undefined", "none",        "string", "mapping", "iterable", "sequence", "number", "integer",
      "float",   "boolean",   "true",        "false",  "equalto", "eq",       "==",       "ne",     "!=",
      "odd",     "even",      "divisibleby", "in",     "lower",   "upper",    "callable", "sameas"};
  return s;
}
const std::set<std::string>& known_methods() {
  static const std::set<std::string> s = {"strip",   "lstrip",  "rstrip",  "split",  "startswith", "endswith",
                                          "upper",   "lower",   "replace", "title",  "capitalize", "items",
                                          "keys",    "values",  "get",     "find",   "count",      "join",
                                          "isdigit", "isspace", "isalpha", "rsplit", "splitlines", "index"};
  return s;
}

class Parser {
 public:
  Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Body parse_all() {
    std::string stop;
    Body b = parse_body({}, stop);
    return b;
  }

 private:
  std::vector<Segment> segs_;
  size_t si_ = 0;
  std::vector<Token> toks_;
  size_t ti_ = 0;
  int depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& p, int line) : p(p) {
      if (++p.depth_ > kMaxDepth)
        throw SyntaxError(line, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // ---- token helpers (within the current tag)
  const Token& peek(size_t k = 0) const { return toks_[std::min(ti_ + k, toks_.size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).kind == Token::Op && peek(k).text == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).kind == Token::Name && peek(k).text == n; }
  Token next() {
    Token t = peek();
    if (ti_ < toks_.size() - 1) ++ti_;
    return t;
  }
  [[noreturn]] void fail(const std::string& what) const { throw SyntaxError(peek().line, what); }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got '" + describe(peek()) + "'");
    next();
  }
  std::string expect_name() {
    if (peek().kind != Token::Name) fail("expected a name, got '" + describe(peek()) + "'");
    return next().text;
  }
  void expect_end() {
    if (peek().kind != Token::End) fail("unexpected '" + describe(peek()) + "'");
  }
  static std::string describe(const Token& t) { return t.kind == Token::End ? "end of tag" : t.text; }

  static ExprP mk(Expr::Kind k, int line, std::vector<ExprP> args = {}, std::string name = "") {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    e->args = std::move(args);
    e->name = std::move(name);
    return measured(e);
  }
  // Sets e's tree depth from its children; SyntaxError past kMaxTreeDepth.
  static std::shared_ptr<Expr> measured(std::shared_ptr<Expr> e) {
    int d = 0;
    for (const ExprP& a : e->args)
      if (a) d = std::max(d, a->depth);
    for (const auto& kv : e->kwargs) d = std::max(d, kv.second->depth);
    e->depth = d + 1;
    if (e->depth > kMaxTreeDepth)
      throw SyntaxError(e->line, "expression nested deeper than " + std::to_string(kMaxTreeDepth) + " levels");
    return e;
  }

  // ---- statements
  // Parses nodes until a block tag whose first word is in `stops` (returned in `stop`; the tag's
  // tokens stay loaded for the caller).
  Body parse_body(const std::set<std::string>& stops, std::string& stop) {
    Body body;
    while (si_ < segs_.size()) {
      const Segment& sg = segs_[si_++];
      if (sg.kind == Segment::Text) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Text;
        n->line = sg.line;
        n->text = sg.text;
        body.push_back(n);
        continue;
      }
      toks_ = lex_tag(sg.text, sg.line);
      ti_ = 0;
      if (sg.kind == Segment::Var) {
        auto n = std::make_shared<Node>();
        n->kind = Node::Output;
        n->line = sg.line;
        n->expr = expr();
        expect_end();
        body.push_back(n);
        continue;
      }
      if (peek().kind != Token::Name) fail("expected a statement");
      const std::string word = peek().text;
      if (stops.count(word)) {
        next();
        stop = word;
        return body;
      }
      next();
      DepthGuard g(*this, sg.line);
      body.push_back(statement(word, sg.line));
    }
    if (!stops.empty()) {
      std::string want;
      for (const auto& s : stops) want += (want.empty() ? "" : " or ") + s;
      throw SyntaxError(segs_.empty() ? 1 : segs_.back().line, "missing '" + want + "'");
    }
    return body;
  }

  NodeP statement(const std::string& word, int line) {
    auto n = std::make_shared<Node>();
    n->line = line;
    std::string stop;
    if (word == "if") {
      n->kind = Node::If;
      ExprP c = expr();
      expect_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, stop);
        n->branches.emplace_back(c, std::move(b));
        if (stop == "endif") break;
        if (stop == "elif") {
          c = expr();
          expect_end();
          continue;
        }
        expect_end();  // else
        Body e = parse_body({"endif"}, stop);
        n->branches.emplace_back(nullptr, std::move(e));
        break;
      }
      expect_end();
      return n;
    }
    if (word == "for") {
      n->kind = Node::For;
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        n->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail("expected 'in'");
      next();
      n->expr = or_expr(true);  // no conditional expression: `if` filters the loop
      if (is_name("if")) {
        next();
        n->cond = or_expr(true);
      }
      if (is_name("recursive")) fail("'for ... recursive' is not supported");
      expect_end();
      n->body = parse_body({"else", "endfor"}, stop);
      if (stop == "else") {
        expect_end();
        n->else_body = parse_body({"endfor"}, stop);
      }
      expect_end();
      return n;
    }
    if (word == "set") {
      const std::string name = expect_name();
      n->targets.push_back(name);
      if (is_op(".")) {
        next();
        n->attr = expect_name();
      } else {
        while (is_op(",")) {
          next();
          n->targets.push_back(expect_name());
        }
      }
      if (peek().kind == Token::End) {
        if (!n->attr.empty() || n->targets.size() != 1) fail("a block 'set' takes one name");
        n->kind = Node::SetBlock;
        n->body = parse_body({"endset"}, stop);
        expect_end();
        return n;
      }
      n->kind = Node::Set;
      expect_op("=");
      n->expr = tuple_or_expr();
      expect_end();
      return n;
    }
    if (word == "generation") {
      n->kind = Node::Generation;
      expect_end();
      n->body = parse_body({"endgeneration"}, stop);
      expect_end();
      return n;
    }
    if (word == "break" || word == "continue") {
      n->kind = word == "break" ? Node::Break : Node::Continue;
      expect_end();
      return n;
    }
    fail("unsupported statement '" + word + "'");
  }

  // ---- expressions
  ExprP tuple_or_expr() {
    const int line = peek().line;
    ExprP e = expr();
    if (!is_op(",")) return e;
    std::vector<ExprP> items{e};
    while (is_op(",")) {
      next();
      if (peek().kind == Token::End) break;
      items.push_back(expr());
    }
    return mk(Expr::TupleLit, line, std::move(items));
  }

  ExprP expr() {
    DepthGuard g(*this, peek().line);
    const int line = peek().line;
    ExprP e = or_expr(false);
    if (is_name("if")) {
      next();
      ExprP c = or_expr(false);
      ExprP other;
      if (is_name("else")) {
        next();
        other = expr();
      }
      return mk(Expr::Cond, line, {e, c, other});
    }
    return e;
  }

  ExprP or_expr(bool) {
    ExprP e = and_expr();
    while (is_name("or")) {
      const int line = next().line;
      e = mk(Expr::Binary, line, {e, and_expr()}, "or");
    }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      const int line = next().line;
      e = mk(Expr::Binary, line, {e, not_expr()}, "and");
    }
    return e;
  }
  ExprP not_expr() {
    if (is_name("not")) {
      DepthGuard g(*this, peek().line);
      const int line = next().line;
      return mk(Expr::Unary, line, {not_expr()}, "not");
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = add();
    while (true) {
      const int line = peek().line;
      std::string op;
      if (peek().kind == Token::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return e;
      }
      e = mk(Expr::Binary, line, {e, add()}, op);
    }
  }
  // One level of left-associative binary operators: operand (op operand)*.
  template <class Operand>
  ExprP left_assoc(std::initializer_list<const char*> ops, Operand operand) {
    ExprP e = operand();
    while (std::any_of(ops.begin(), ops.end(), [&](const char* op) { return is_op(op); })) {
      const Token t = next();
      e = mk(Expr::Binary, t.line, {e, operand()}, t.text);
    }
    return e;
  }
  ExprP add() {
    return left_assoc({"+", "-"}, [this] { return concat(); });
  }
  ExprP concat() {
    return left_assoc({"~"}, [this] { return mul(); });
  }
  ExprP mul() {
    return left_assoc({"*", "/", "//", "%"}, [this] { return pow(); });
  }
  ExprP pow() {
    return left_assoc({"**"}, [this] { return unary(); });
  }
  // As jinja2: `-x|f` is `(-x)|f`; the operand of a sign takes no filters.
  ExprP unary(bool with_filters = true) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      DepthGuard g(*this, peek().line);
      const Token t = next();
      e = postfix(mk(Expr::Unary, t.line, {unary(false)}, t.text));
    } else {
      e = postfix(primary());
    }
    return with_filters ? filters(e) : e;
  }
  ExprP filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        const std::string name = expect_name();
        if (!known_filters().count(name)) throw SyntaxError(line, "unsupported filter '" + name + "'");
        auto f = std::make_shared<Expr>();
        f->kind = Expr::Filter;
        f->line = line;
        f->name = name;
        f->args.push_back(e);
        if (is_op("(")) call_args(*f);
        e = measured(f);
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = std::make_shared<Expr>();
        t->kind = Expr::Test;
        t->line = line;
        if (is_name("not")) {
          next();
          t->negate = true;
        }
        std::string name;
        if (peek().kind == Token::Name) {
          name = next().text;
        } else if (is_op("==") || is_op("!=")) {
          name = next().text;
        } else {
          fail("expected a test name");
        }
        if (!known_tests().count(name)) throw SyntaxError(line, "unsupported test '" + name + "'");
        t->name = name;
        t->args.push_back(e);
        if (is_op("(")) {
          call_args(*t);
        } else if (peek().kind == Token::String || peek().kind == Token::Int || peek().kind == Token::Float ||
                   (peek().kind == Token::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          t->args.push_back(postfix(primary()));  // `is divisibleby 3`, `is equalto 'x'`
        }
        e = measured(t);
      } else {
        return e;
      }
    }
  }
  void call_args(Expr& c) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Name && is_op("=", 1)) {
        std::string k = next().text;
        next();
        c.kwargs.emplace_back(k, expr());
      } else {
        if (!c.kwargs.empty()) fail("a positional argument after a keyword argument");
        c.args.push_back(expr());
      }
      if (is_op(",")) {
        next();
      } else if (!is_op(")")) {
        fail("expected ',' or ')', got '" + describe(peek()) + "'");
      }
    }
    next();
  }
  ExprP postfix(ExprP e) {
    while (true) {
      const int line = peek().line;
      if (is_op(".")) {
        next();
        Token t = next();
        if (t.kind != Token::Name && t.kind != Token::Int) fail("expected an attribute name");
        auto a = mk(Expr::Attr, line, {e}, t.text);
        e = a;
      } else if (is_op("[")) {
        next();
        DepthGuard g(*this, line);
        ExprP parts[3];
        int colons = 0;
        while (true) {
          if (is_op("]")) break;
          if (is_op(":")) {
            next();
            if (++colons > 2) fail("bad slice");
            continue;
          }
          if (parts[colons]) fail("expected ':' or ']'");
          parts[colons] = expr();
        }
        next();
        if (colons == 0) {
          if (!parts[0]) fail("empty subscript");
          e = mk(Expr::Index, line, {e, parts[0]});
        } else {
          e = mk(Expr::Slice, line, {e, parts[0], parts[1], parts[2]});
        }
      } else if (is_op("(")) {
        if (e->kind == Expr::Attr && !known_methods().count(e->name))
          throw SyntaxError(line, "unsupported method '" + e->name + "'");
        if (e->kind == Expr::Name && e->name != "raise_exception" && e->name != "range" && e->name != "namespace" &&
            e->name != "strftime_now" && e->name != "dict")
          throw SyntaxError(line, "unsupported function '" + e->name + "'");
        auto c = std::make_shared<Expr>();
        c->kind = Expr::Call;
        c->line = line;
        c->args.push_back(e);
        call_args(*c);
        e = measured(c);
      } else {
        return e;
      }
    }
  }
  // Python's int(): any length; beyond 64 bits the digits are kept (Value::BigInt).
  static Value int_literal(const std::string& text) {
    std::string digits;
    for (char c : text)
      if (c != '_') digits += c;
    const size_t nz = digits.find_first_not_of('0');
    digits = nz == std::string::npos ? "0" : digits.substr(nz);
    if (digits.size() < 19 || (digits.size() == 19 && digits <= "9223372036854775807"))
      return Value::integer(std::stoll(digits));
    return Value::big_integer(digits);
  }

  ExprP primary() {
    DepthGuard g(*this, peek().line);
    const Token t = next();
    auto lit = [&](Value v) {
      auto e = std::make_shared<Expr>();
      e->kind = Expr::Literal;
      e->line = t.line;
      e->value = std::move(v);
      return ExprP(e);
    };
    switch (t.kind) {
      case Token::String: {
        std::string s = t.text;
        while (peek().kind == Token::String) s += next().text;  // adjacent literals concatenate
        return lit(Value::str(s));
      }
      case Token::Int:
        return lit(int_literal(t.text));
      case Token::Float: {
        // Python's float(): 1e999 is inf, 1e-400 is 0.0 (strtod's ERANGE results).
        std::string digits;
        for (char c : t.text)
          if (c != '_') digits += c;
        return lit(Value::real(std::strtod(digits.c_str(), nullptr)));
      }
      case Token::Name:
        if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return lit(Value::none());
        return mk(Expr::Name, t.line, {}, t.text);
      case Token::Op:
        if (t.text == "(") {
          if (is_op(")")) {
            next();
            return mk(Expr::TupleLit, t.line);
          }
          ExprP e = expr();
          if (is_op(",")) {
            std::vector<ExprP> items{e};
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              items.push_back(expr());
            }
            e = mk(Expr::TupleLit, t.line, std::move(items));
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          std::vector<ExprP> items;
          while (!is_op("]")) {
            items.push_back(expr());
            if (is_op(",")) {
              next();
            } else if (!is_op("]")) {
              fail("expected ',' or ']'");
            }
          }
          next();
          return mk(Expr::ListLit, t.line, std::move(items));
        }
        if (t.text == "{") {
          std::vector<ExprP> items;  // key, value, key, value...
          while (!is_op("}")) {
            items.push_back(expr());
            expect_op(":");
            items.push_back(expr());
            if (is_op(",")) {
              next();
            } else if (!is_op("}")) {
              fail("expected ',' or '}'");
            }
          }
          next();
          return mk(Expr::DictLit, t.line, std::move(items));
        }
        break;
      default:
        break;
    }
    throw SyntaxError(t.line, "unexpected '" + describe(t) + "'");
  }
};

}  // namespace

Body parse_template(const std::string& src, const LexOptions& opt) {
  Parser p(split_template(src, opt));
  return p.parse_all();
}

}  // namespace sf::jinja
