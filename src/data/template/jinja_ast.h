// The Jinja subset's lexer output and syntax tree (src/data/template/jinja_lexer.cpp, jinja_parser.cpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "data/template/jinja_value.h"

namespace sf::jinja {

// A construct the subset does not have, or bad syntax: refused when the template is loaded.
struct SyntaxError : std::runtime_error {
  SyntaxError(int line, const std::string& what)
      : std::runtime_error("line " + std::to_string(line) + ": " + what), line(line) {}
  int line;
};

// Whitespace options (transformers renders chat templates with both on).
struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// The template cut into text and tags, whitespace control applied.
struct Segment {
  enum Kind { Text, Var, Block } kind;
  std::string text;  // Text: the text; Var/Block: the tag's inside
  int line;
};
std::vector<Segment> split_template(const std::string& src, const LexOptions& opt = {});

struct Token {
  enum Kind { Name, Int, Float, String, Op, End } kind;
  std::string text;  // Name, Op, String (unescaped); Int/Float source text
  int line;
};
std::vector<Token> lex_tag(const std::string& inside, int line);

struct Expr;
using ExprP = std::shared_ptr<const Expr>;

struct Expr {
  enum Kind { Literal, Name, ListLit, TupleLit, DictLit, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, Cond };
  Kind kind;
  int line = 0;
  int depth = 1;                                      // of the tree below (the parser bounds it)
  Value value;                                        // Literal
  std::string name;                                   // Name, Attr member, Filter/Test name, Unary/Binary operator
  bool negate = false;                                // Test: `is not`
  std::vector<ExprP> args;                            // children (see the parser); null = absent
  std::vector<std::pair<std::string, ExprP>> kwargs;  // Call/Filter keyword arguments
};

struct Node;
using NodeP = std::shared_ptr<const Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum Kind { Text, Output, If, For, Set, SetBlock, Generation, Break, Continue };
  Kind kind;
  int line = 0;
  std::string text;                              // Text
  ExprP expr;                                    // Output, Set value, For iterable
  std::vector<std::string> targets;              // For loop variables, Set name(s)
  std::string attr;                              // Set ns.attr: the attribute (targets[0] is the namespace)
  ExprP cond;                                    // For ... if cond
  std::vector<std::pair<ExprP, Body>> branches;  // If: (cond, body), else has cond null
  Body body, else_body;                          // For, SetBlock, Generation
  bool recursive = false;
};

// Parses a template. SyntaxError for anything outside the subset.
Body parse_template(const std::string& src, const LexOptions& opt = {});

}  // namespace sf::jinja
