// Chat templates: the Jinja subset interpreter (each construct), the real templates of Llama 3,
// 3.1, 3.2, Qwen2.5, Qwen3 and Mistral v0.1/v0.3 (tests/data/chat_templates) rendered for several
// conversations against strings derived by reading each template, hostile templates refused or
// bounded, and assistant masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "chat_fixtures.h"
#include "core/error.h"
#include "data/tokenizer/unicode.h"
#include "data/template/chat.h"
#include "data/template/jinja_eval.h"
#include "data/tokenizer/tokenizer.h"
#include "io/json_file.h"
#include "test_util.h"

using namespace sf;
using namespace sf::jinja;
using nlohmann::json;

namespace {

const std::string kDir = std::string(SF_SOURCE_DIR) + "/tests/data/chat_templates/";
constexpr std::time_t kNow = 1725494400;  // 2024-09-05 00:00 UTC

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Dict vars_of(const json& j) {
  Dict d;
  for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(it.key(), Value::from_json(it.value()));
  return d;
}

std::string render(const std::string& src, const json& vars = json::object(), const RenderLimits& lim = {}) {
  return Template::parse(src).render(vars_of(vars), kNow, lim).text;
}

std::string render_error(const std::string& src, const json& vars = json::object(), const RenderLimits& lim = {}) {
  try {
    render(src, vars, lim);
  } catch (const RenderError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string syntax_error(const std::string& src) {
  try {
    Template::parse(src);
  } catch (const SyntaxError& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- interpreter constructs

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(render("hello"), "hello");
  EXPECT_EQ(
      render("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}"),
      "7|9|3|-4|1|2|1024");
  EXPECT_EQ(render("{{ 7 / 2 }}|{{ 1.5 + 1 }}|{{ 0.1 }}|{{ 1e20 }}|{{ 100.0 }}"), "3.5|2.5|0.1|1e+20|100.0");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true }}|{{ 'x' + 'y' }}|{{ 'ab' * 3 }}"), "a1NoneTrue|xy|ababab");
  EXPECT_EQ(render("{{ [1, 'a', none] }}|{{ {'k': 'v', 'n': 2} }}|{{ (1, 2) }}"),
            "[1, 'a', None]|{'k': 'v', 'n': 2}|(1, 2)");
  EXPECT_EQ(render("{{ x }}|{{ x.y if x is defined else 'u' }}", {{"x", {{"y", 3}}}}), "{'y': 3}|3");
  EXPECT_EQ(render("{{ missing }}|{{ 'a' if false }}|"), "||");
  EXPECT_EQ(render("{{ 1 < 2 and 2 <= 2 and 3 > 2 and 3 >= 4 }}|{{ not 0 }}|{{ 0 or 'd' }}|{{ 'b' and 'c' }}"),
            "False|True|d|c");
  EXPECT_EQ(render("{{ 'a' in 'cat' }}|{{ 2 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 3 not in [1] }}"),
            "True|True|True|True");
  EXPECT_EQ(render("{{ 'it''s' }}|{{ \"q\\\"\\n\\t\\u00e9\" }}"), "its|q\"\n\t\xC3\xA9");
  EXPECT_EQ(render("{{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ [1] == [1] }}"), "True|True|True");
}

TEST(Jinja, SubscriptsAndSlices) {
  const json v = {{"m", json::array({"a", "b", "c", "d"})}, {"s", "h\xC3\xA9llo"}, {"d", {{"k", "v"}}}};
  EXPECT_EQ(render("{{ m[0] }}{{ m[-1] }}{{ m[1:3] }}{{ m[::-1] }}{{ m[::2] }}{{ m[5] }}", v),
            "ad['b', 'c']['d', 'c', 'b', 'a']['a', 'c']");
  EXPECT_EQ(render("{{ s[1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s|length }}", v), "\xC3\xA9|\xC3\xA9l|oll\xC3\xA9h|5");
  EXPECT_EQ(render("{{ d['k'] }}{{ d.k }}{{ d.missing is defined }}", v), "vvFalse");
}

TEST(Jinja, ForLoops) {
  const json v = {{"xs", json::array({"a", "b", "c"})}};
  EXPECT_EQ(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}{{ loop.first }}{{ loop.last }}{{ "
                   "loop.length }};{% endfor %}",
                   v),
            "10aTrueFalse3;21bFalseFalse3;32cFalseTrue3;");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in xs if x != 'b' %}{{ x }}{{ loop.index }}{% endfor %}", v), "a1c2");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"), "a=1,b=2,");
  EXPECT_EQ(render("{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}"), "ab");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", v), "a");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% endfor %}", v), "ac");
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 1, -2) %}{{ i }}{% endfor %}"),
            "01253");
  EXPECT_EQ(render("{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}", v),
            "1231|1232|1233|");
  // A loop's set does not leak out of it (jinja2 scoping); a namespace carries state out.
  EXPECT_EQ(render("{% set n = 0 %}{% for x in xs %}{% set n = n + 1 %}{% endfor %}{{ n }}", v), "0");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}", v),
            "3");
}

TEST(Jinja, IfSetAndBlocks) {
  EXPECT_EQ(render("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}"), "c");
  EXPECT_EQ(render("{% if false %}a{% else %}d{% endif %}"), "d");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(render("{% set x %}in{{ 1 }}side{% endset %}[{{ x }}]"), "[in1side]");
  EXPECT_EQ(render("{# a comment #}x{# another #}"), "x");
  EXPECT_EQ(render("a{% generation %}b{% endgeneration %}c"), "abc");
  const Rendered r =
      Template::parse("a{% generation %}bc{% endgeneration %}d{% generation %}e{% endgeneration %}").render({}, kNow);
  ASSERT_EQ(r.generation.size(), 2u);
  EXPECT_EQ(r.generation[0], std::make_pair(size_t(1), size_t(3)));
  EXPECT_EQ(r.generation[1], std::make_pair(size_t(4), size_t(5)));
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before one goes.
  EXPECT_EQ(render("{% if true %}\n  x\n{% endif %}\ny"), "  x\ny");
  EXPECT_EQ(render("  {% if true %}\nx\n  {% endif %}\n"), "x\n");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a\n  {{- 'b' -}}\n  c"), "abc");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");  // not after {{ }}
  EXPECT_EQ(render("x {%+ if true %}y{% endif %}"), "x y");
  EXPECT_EQ(render("a {% if true %}b{% endif %}"), "a b");  // lstrip only at the start of a line
  EXPECT_EQ(render("{# c #}\nx"), "x");
}

TEST(Jinja, Filters) {
  const json v = {{"ms", json::array({{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", "u"}}})}};
  EXPECT_EQ(render("[{{ '  a b \\n'|trim }}][{{ '\xC2\xA0x\xE3\x80\x80'|trim }}]"), "[a b][x]");
  EXPECT_EQ(render("{{ 'abc'|length }}{{ [1,2]|length }}{{ {'a':1}|count }}"), "321");
  EXPECT_EQ(
      render("{{ 'Hi'|upper }}{{ 'Hi'|lower }}{{ 5|string ~ 'x' }}{{ 'hello world'|title }}{{ 'hELLO'|capitalize }}"),
      "HIhi5xHello WorldHello");
  EXPECT_EQ(render("{{ x|default('d') }}{{ ''|default('e', true) }}{{ 'v'|d('n') }}"), "dev");
  EXPECT_EQ(render("{{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ 'abc'|first }}"), "13a");
  EXPECT_EQ(render("{{ ['a','b']|join(', ') }}|{{ [1,2]|join }}|{{ 'a-b-c'|replace('-', '+') }}"), "a, b|12|a+b+c");
  EXPECT_EQ(render("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}", v), "['u']");
  EXPECT_EQ(render("{{ ms|rejectattr('role', 'equalto', 'user')|list|length }}", v), "1");
  EXPECT_EQ(render("{{ ['a','b','a']|reject('equalto', 'a')|list }}{{ [1,2,1]|unique|list }}"), "['b'][1, 2]");
  EXPECT_EQ(
      render("{{ {'a': 1}|items|list }}{{ [3,1,2]|reverse|list }}{{ [1,2,3]|sum }}{{ [3,1]|min }}{{ [3,1]|max }}"),
      "[('a', 1)][2, 1, 3]613");
  EXPECT_EQ(render("{{ '42'|int + 1 }}{{ 2|float }}{{ -3|abs }}"), "432.03");
}

TEST(Jinja, ToJson) {
  const json v = {
      {"t", {{"name", "f"}, {"parameters", {{"a", json::array({1, 2.5, true, nullptr})}, {"s", "\xC3\xA9\"\n<>&"}}}}}};
  EXPECT_EQ(render("{{ t|tojson }}", v),
            "{\"name\": \"f\", \"parameters\": {\"a\": [1, 2.5, true, null], \"s\": \"\xC3\xA9\\\"\\n<>&\"}}");
  EXPECT_EQ(render("{{ t|tojson(indent=2) }}", v),
            "{\n  \"name\": \"f\",\n  \"parameters\": {\n    \"a\": [\n      1,\n      2.5,\n      true,\n      null\n "
            "   ],\n"
            "    \"s\": \"\xC3\xA9\\\"\\n<>&\"\n  }\n}");
  EXPECT_EQ(render("{{ {}|tojson }}{{ []|tojson }}{{ 'x'|tojson }}"), "{}[]\"x\"");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(render("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}"),
            "FalseTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ [] is iterable }}{{ 1 is iterable }}{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}"),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is equalto 'a' }}{{ 1 is not none }}"),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ false is false }}{{ true is true }}{{ 1 is true }}{{ strftime_now is defined }}"),
            "TrueTrueFalseTrue");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(render("[{{ '\\n x \\n'.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\nab'.lstrip('\\n') }}][{{ "
                   "'ab\\n\\n'.rstrip('\\n') }}]"),
            "[x][a][ab][ab]");
  // Unicode whitespace (Python's str.isspace), multi-byte characters kept whole, `chars` of several
  // bytes, a truncated sequence at the end as one character, strip of nothing but whitespace.
  EXPECT_EQ(render("[{{ '\u3000 \u00e9 x\u00a0\u2028'.strip() }}][{{ '\u2028a\u2028' | trim }}][{{ "
                   "'\u00e9\u00e9a\u00e9'.strip('\u00e9') }}][{{ ' \n\t '.strip() }}][{{ '  x '.rstrip() }}|"
                   "{{ ' x  '.lstrip() }}]"),
            "[\u00e9 x][a][a][][  x|x  ]");
  EXPECT_EQ(render("[{{ s.strip() }}]", json{{"s", " a \xE2\x80"}}), "[a \xE2\x80]");
  EXPECT_EQ(render("{{ 'a</think>b</think>c'.split('</think>') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}"),
            "['a', 'b', 'c']['a', 'b']['a', 'b,c']");
  EXPECT_EQ(render("{{ 'a,b,c'.rsplit(',', 1) }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ "
                   "'abc'.startswith(('x', 'a')) }}"),
            "['a,b', 'c']TrueTrueTrue");
  EXPECT_EQ(
      render(
          "{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'aXa'.replace('a', 'b') }}{{ 'abc'.find('c') }}{{ 'a b'.title() }}"),
      "HIhibXb2A B");
  EXPECT_EQ(
      render(
          "{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 'd') }}{{ {'a': 1}.keys()|list }}{{ {'a': 1}.values()|list }}"),
      "1d['a'][1]");
  EXPECT_EQ(render("{{ '-'.join(['a', 'b']) }}{{ strftime_now('%Y-%m-%d %d %b %Y') }}"), "a-b2024-09-05 05 Sep 2024");
}

TEST(Jinja, Errors) {
  EXPECT_NE(render_error("{{ raise_exception('Roles must alternate') }}").find("Roles must alternate"),
            std::string::npos);
  EXPECT_NE(render_error("{{ x.y }}").find("'x' is undefined"), std::string::npos);
  EXPECT_NE(render_error("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(render_error("{{ 1 // 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(render_error("{% set x = 1 %}{% set x.y = 2 %}").find("not a namespace"), std::string::npos);
  EXPECT_NE(render_error("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  EXPECT_NE(render_error("{% for x in 3 %}{% endfor %}").find("not iterable"), std::string::npos);
}

TEST(Jinja, UnsupportedConstructsAreRefusedAtParse) {
  EXPECT_NE(syntax_error("{% macro f() %}x{% endmacro %}").find("unsupported statement 'macro'"), std::string::npos);
  EXPECT_NE(syntax_error("{% include 'x' %}").find("unsupported statement 'include'"), std::string::npos);
  EXPECT_NE(syntax_error("{{ x|wordwrap }}").find("unsupported filter 'wordwrap'"), std::string::npos);
  EXPECT_NE(syntax_error("{{ x is sameas_foo }}").find("unsupported test"), std::string::npos);
  EXPECT_NE(syntax_error("{{ x.pop() }}").find("unsupported method 'pop'"), std::string::npos);
  EXPECT_NE(syntax_error("{{ cycler() }}").find("unsupported function 'cycler'"), std::string::npos);
  EXPECT_NE(syntax_error("{% if x %}").find("missing 'elif or else or endif'"), std::string::npos);
  EXPECT_NE(syntax_error("{{ 1 + }}").find("line 1"), std::string::npos);
  EXPECT_NE(syntax_error("a\n{{ 'x' ").find("line 2: unclosed"), std::string::npos);
  EXPECT_NE(syntax_error("{% for x in y recursive %}{% endfor %}").find("recursive"), std::string::npos);
  EXPECT_NE(syntax_error("{% break %}").find("(no error)"), std::string::npos);  // checked at render
}

TEST(Jinja, HostileTemplatesAreBounded) {
  RenderLimits lim;
  // Under the sanitizers a tenth of the steps and 1/16 of the output: the same checks stop the same
  // programs, sooner.
  lim.max_steps = test::heavy(1'000'000, 100'000);
  lim.max_output = test::heavy(1 << 20, 1 << 16);
  lim.max_items = 1 << 20;
  lim.max_iterations = UINT64_MAX;  // the steps stop the nested loops below
  // Deep nesting: refused by the parser, no stack overflow.
  EXPECT_NE(
      syntax_error("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("nested deeper"),
      std::string::npos);
  EXPECT_NE(syntax_error(std::string(5000, '[')).find("(no error)"), std::string::npos);  // plain text
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_NE(syntax_error(ifs).find("nested deeper"), std::string::npos);
  EXPECT_NE(syntax_error("{{ " + std::string(100000, '-') + "1 }}").find("nested deeper"), std::string::npos);
  EXPECT_NE(syntax_error("{{ " + std::string(100000, '[') + " }}").find("nested deeper"), std::string::npos);
  // Loops that would run long, output that would grow without bound.
  EXPECT_NE(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {}, lim)
                .find("steps"),
            std::string::npos);
  EXPECT_NE(render_error("{{ range(1000000000) }}", {}, lim).find("too long"), std::string::npos);
  EXPECT_NE(render_error("{% set s = 'x' * 1000000000 %}", {}, lim).find("too long"), std::string::npos);
  EXPECT_NE(
      render_error("{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}", {}, lim)
          .find("output is longer"),
      std::string::npos);
  EXPECT_NE(
      render_error("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   {}, lim)
          .find("too long"),
      std::string::npos);
  EXPECT_NE(render_error("{{ 2 ** 100 }}", {}, lim).find("overflow"), std::string::npos);
}

// Issue 16's reproducers: nesting, cycles and budgets of an untrusted template stop with a
// RenderError or SyntaxError naming the line, quickly, without a crash or a large allocation.
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string repeated(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(Jinja, LongChainsAreRefusedAtParse) {
  const std::string sum = "1" + repeated("+1", 9999);  // 10,000 terms, ~20 KB
  for (const std::string& src :
       {"{{ " + sum + " }}", "{% if false %}{{ " + sum + " }}{% endif %}", "{{ x" + repeated("|trim", 10000) + " }}",
        "{{ x" + repeated(".a", 10000) + " }}", "{{ x" + repeated("[0]", 10000) + " }}",
        "{{ x" + repeated(" is defined", 10000) + " }}", "{{ 'a'" + repeated(" ~ 'a'", 10000) + " }}",
        "{% if false %}{{ x" + repeated(".strip()", 10000) + " }}{% endif %}"}) {
    const std::string err = syntax_error(src);
    EXPECT_NE(err.find("line 1: expression nested deeper than 256 levels"), std::string::npos) << err;
  }
  // Real chains stay well below the limit.
  EXPECT_EQ(render("{{ 1" + repeated("+1", 99) + " }}"), "100");
}

// The time bounds below guard against hangs (the unbounded programs ran for minutes or exhausted
// memory), not speed: 60 s leaves room for the -O0 sanitizer builds on a loaded 2-core machine
// (the 10^6-iteration loop took 12 s under ASan in CI's conditions; session 13's clean-clone CI
// saw 97 s beside the other sanitizer tests: 300 s there, still far from a hang).
constexpr double kNoHangSeconds = test::heavy(60.0, 300.0);

TEST(Jinja, NamespacesCannotFormCycles) {
  EXPECT_NE(render_error("{% set ns = namespace(a=1) %}\n{% set ns.self = ns %}{{ ns|tojson }}")
                .find("line 2: a namespace cannot hold a namespace"),
            std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(a=1) %}{% set ns.l = [1, [ns]] %}{{ ns|tojson }}")
                .find("a namespace cannot hold a namespace"),
            std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(a=1) %}{% set m = namespace(n=ns) %}").find("cannot hold a namespace"),
            std::string::npos);
  // tojson of a namespace is Python's TypeError; a namespace inside a list prints.
  EXPECT_NE(render_error("{% set ns = namespace(a=1) %}{{ ns|tojson }}").find("not JSON serializable"),
            std::string::npos);
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{{ [ns]|length }}"), "1");
  // Values nested by a loop stop at the nesting limit (freeing them recurses boundedly).
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(render_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}")
                .find("nested deeper than"),
            std::string::npos);
  EXPECT_NE(render_error("{{ " + repeated("[", 50) + repeated("]", 50) + " }}").find("(no error)"), std::string::npos);
  EXPECT_LT(seconds_since(t0), kNoHangSeconds);
}

TEST(Jinja, RenderBudgetsStopEarly) {
  // The ordinary build runs the default limits at full size (that they stop in time is the point);
  // the sanitizer builds run the same programs against limits and sizes cut 16-fold (the budgets'
  // code paths are what they check: at full size this test took 219 s of its 300 under ASan in CI).
  const int64_t cut = test::heavy(1, 16);
  RenderLimits lim;
  lim.max_value_bytes /= uint64_t(cut);
  lim.max_items /= size_t(cut);
  lim.max_iterations /= uint64_t(cut);
  const std::string big = std::to_string(16000000 / cut);  // a string / range of max_items elements
  const std::string loop = cut == 1 ? "1000" : "300";  // loop^2 > max_iterations
  struct Case {
    std::string src, needle;
  };
  const std::vector<Case> cases = {
      {"{% set x = [('a'*" + big + ")]*300 %}",
       "values take more than " + std::to_string(lim.max_value_bytes) + " bytes"},
      {"{% for c in 'a'*" + big + " %}{% endfor %}", "values take more than"},
      {"{% set ns = namespace(l=[]) %}{% for i in range(" + std::to_string(1000000 / cut) +
           ") %}{% set ns.l = ns.l + [i] %}{% endfor %}",
       "values take more than"},
      {"{{ range(" + big + ")|list|unique|length }}", "values take more than"},
      {"{% for i in range(" + loop + ") %}{% for j in range(" + loop + ") %}{% endfor %}{% endfor %}",
       "loops run more than " + std::to_string(lim.max_iterations) + " iterations"},
      {"{% set s = 'a'*" + big + " %}{% for i in range(100) %}{% set t = s %}{% endfor %}", "values take more than"},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string err = render_error("\n" + c.src, json::object(), lim);
    EXPECT_NE(err.find("line 2: "), std::string::npos) << c.src << ": " << err;
    EXPECT_NE(err.find(c.needle), std::string::npos) << c.src << ": " << err;
    EXPECT_LT(seconds_since(t0), kNoHangSeconds) << c.src;
  }
  // Substring search is linear ('aaa...ab' in 'aaa...a' is quadratic for std::string::find).
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(render("{% set h = 'a'*500000 %}{% set n = 'a'*50000 ~ 'b' %}{% for i in range(20) %}"
                   "{{ n in h }}{{ h.find(n) }}{{ h.count(n) }}{{ h.split(n)|length }}{% endfor %}"),
            repeated("False-101", 20));
  EXPECT_LT(seconds_since(t0), kNoHangSeconds);
  // unique hashes (linear), ignores case by default as jinja2, and refuses unhashable items.
  EXPECT_EQ(render("{{ ['a', 'A', 'b', 1, 1.0, true, 2]|unique|list }}"), "['a', 'b', 1, 2]");
  EXPECT_EQ(render("{{ ['a', 'A']|unique(case_sensitive=true)|list }}"), "['a', 'A']");
  EXPECT_NE(render_error("{{ [[1], [1]]|unique|list }}").find("unhashable type: 'list'"), std::string::npos);
  EXPECT_EQ(render("{{ range(100000)|list|unique|length }}"), "100000");
}

TEST(Jinja, NumbersAsPython) {
  EXPECT_EQ(render("{{ 1e999 }} {{ -1e999 }} {{ 1e-400 }} {{ 1E+400 }} {{ 1_000.5 }}"), "inf -inf 0.0 inf 1000.5");
  EXPECT_EQ(render("{{ '1e999'|float }} {{ ' 2.5 '|float }} {{ 'x'|float }} {{ '0x10'|float }}"), "inf 2.5 0.0 0.0");
  // Integer literals of any length keep their digits (Python's int); arithmetic on them is refused.
  EXPECT_EQ(render("{{ 123456789012345678901234567890 }} {{ -99999999999999999999 }} {{ [18446744073709551616] }}"),
            "123456789012345678901234567890 -99999999999999999999 [18446744073709551616]");
  EXPECT_EQ(render("{{ 9223372036854775807 }} {{ 0009 }}"), "9223372036854775807 9");
  EXPECT_NE(render_error("{{ 99999999999999999999 + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_EQ(render("{{ 99999999999999999999 is integer }} {{ 99999999999999999999 is number }}"), "True True");
}

TEST(Jinja, JsonKeepsOrderAndDigits) {
  const Value v = Value::parse_json(
      R"({"name": "get", "arguments": {"z": 1, "a": [2, 3]}, "big": 12345678901234567890123, "u": 18446744073709551615,)"
      R"( "f": 1.5, "n": null, "z": 1, "z": 2})");
  Dict vars{{"v", v}};
  EXPECT_EQ(Template::parse("{{ v|tojson }}").render(vars, kNow).text,
            R"({"name": "get", "arguments": {"z": 1, "a": [2, 3]}, "big": 12345678901234567890123,)"
            R"( "u": 18446744073709551615, "f": 1.5, "n": null, "z": 2})");
  EXPECT_EQ(Template::parse("{% for k, x in v.items() %}{{ k }},{% endfor %}").render(vars, kNow).text,
            "name,arguments,big,u,f,n,z,");
  EXPECT_EQ(Template::parse("{{ v.big }} {{ v.arguments }}").render(vars, kNow).text,
            "12345678901234567890123 {'z': 1, 'a': [2, 3]}");
  // Dict literals keep the order written (a repeated key: first place, last value).
  EXPECT_EQ(render("{{ {'name': 'f', 'arguments': 1, 'name': 'g'}|tojson }}"), R"({"name": "g", "arguments": 1})");
  EXPECT_EQ(render("{{ dict(b=1, a=2)|tojson }}"), R"({"b": 1, "a": 2})");
  EXPECT_THROW(Value::parse_json(std::string(600, '[') + std::string(600, ']')), RenderError);
  EXPECT_THROW(Value::parse_json("{\"a\": "), RenderError);
}

// ---- real templates

const json kSystemChat = json::array({{{"role", "system"}, {"content", "You are helpful."}},
                                      {{"role", "user"}, {"content", "Hi there"}},
                                      {{"role", "assistant"}, {"content", "Hello! How can I help?"}}});
const json kMultiTurn = json::array({{{"role", "user"}, {"content", "2+2?"}},
                                     {{"role", "assistant"}, {"content", "4"}},
                                     {{"role", "user"}, {"content", "and 3+3?"}},
                                     {{"role", "assistant"}, {"content", "6"}}});
const json kUnicodeEmpty =
    json::array({{{"role", "user"}, {"content", "  h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 "}},
                 {{"role", "assistant"}, {"content", ""}}});

ChatTemplate real(const std::string& name, const std::string& bos, const std::string& eos) {
  Dict special;
  if (!bos.empty()) special.emplace_back("bos_token", Value::str(bos));
  special.emplace_back("eos_token", Value::str(eos));
  return ChatTemplate::parse(read_file(kDir + name), kDir + name, special);
}

std::string chat_text(const ChatTemplate& t, const json& msgs) { return render_chat(t, msgs, kNow, "test").text; }

const std::string kL3Sys = "<|start_header_id|>system<|end_header_id|>\n\n";
const std::string kL3User = "<|start_header_id|>user<|end_header_id|>\n\n";
const std::string kL3Asst = "<|start_header_id|>assistant<|end_header_id|>\n\n";

TEST(ChatTemplates, Llama3) {
  const ChatTemplate t = real("llama3.jinja", "<|begin_of_text|>", "<|end_of_text|>");
  EXPECT_EQ(chat_text(t, kSystemChat), "<|begin_of_text|>" + kL3Sys + "You are helpful.<|eot_id|>" + kL3User +
                                           "Hi there<|eot_id|>" + kL3Asst + "Hello! How can I help?<|eot_id|>" +
                                           kL3Asst);
  EXPECT_EQ(chat_text(t, kUnicodeEmpty), "<|begin_of_text|>" + kL3User +
                                             "h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80<|eot_id|>" +
                                             kL3Asst + "<|eot_id|>" + kL3Asst);
}

TEST(ChatTemplates, Llama31And32) {
  for (const char* name : {"llama3.1.jinja", "llama3.2.jinja"}) {
    SCOPED_TRACE(name);
    const ChatTemplate t = real(name, "<|begin_of_text|>", "<|eot_id|>");
    const std::string date = std::string(name) == "llama3.1.jinja" ? "26 Jul 2024" : "05 Sep 2024";
    const std::string head =
        "<|begin_of_text|>" + kL3Sys + "Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n";
    EXPECT_EQ(chat_text(t, kSystemChat), head + "You are helpful.<|eot_id|>" + kL3User + "Hi there<|eot_id|>" +
                                             kL3Asst + "Hello! How can I help?<|eot_id|>");
    EXPECT_EQ(chat_text(t, kMultiTurn), head + "<|eot_id|>" + kL3User + "2+2?<|eot_id|>" + kL3Asst + "4<|eot_id|>" +
                                            kL3User + "and 3+3?<|eot_id|>" + kL3Asst + "6<|eot_id|>");
    EXPECT_EQ(chat_text(t, kUnicodeEmpty), head + "<|eot_id|>" + kL3User +
                                               "h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80<|eot_id|>" +
                                               kL3Asst + "<|eot_id|>");
    // add_generation_prompt and tools (rendered into the first user message, tojson(indent=4)).
    Dict vars = t.special;
    vars.emplace_back("messages", Value::from_json(json::array({{{"role", "user"}, {"content", "Weather?"}}})));
    vars.emplace_back("add_generation_prompt", Value::boolean(true));
    vars.emplace_back("tools", Value::from_json(json::array({{{"name", "get"}, {"parameters", {{"x", 1}}}}})));
    const std::string out = t.tmpl.render(vars, kNow).text;
    EXPECT_EQ(
        out, "<|begin_of_text|>" + kL3Sys +
                 "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n<|eot_id|>" +
                 kL3User +
                 "Given the following functions, please respond with a JSON for a function call with its proper "
                 "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                 "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n{\n    \"name\": "
                 "\"get\",\n    \"parameters\": {\n        \"x\": 1\n    }\n}\n\nWeather?<|eot_id|>" +
                 kL3Asst);
  }
}

TEST(ChatTemplates, Qwen25) {
  const ChatTemplate t = real("qwen2.5.jinja", "", "<|im_end|>");
  EXPECT_EQ(chat_text(t, kSystemChat),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n");
  EXPECT_EQ(
      chat_text(t, kMultiTurn),
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n"
      "<|im_start|>assistant\n6<|im_end|>\n");
  EXPECT_EQ(chat_text(t, kUnicodeEmpty),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n  h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 "
            "<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n");
  const json tool_call = json::array(
      {{{"role", "user"}, {"content", "w?"}},
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls", json::array({{{"function", {{"name", "get"}, {"arguments", {{"city", "Paris"}}}}}}})}}});
  EXPECT_EQ(chat_text(t, tool_call),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get\", \"arguments\": "
            "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n");
}

TEST(ChatTemplates, Qwen3) {
  const ChatTemplate t = real("qwen3.jinja", "", "<|im_end|>");
  EXPECT_EQ(chat_text(t, kSystemChat),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nHello! How can I help?<|im_end|>\n");
  EXPECT_EQ(
      chat_text(t, kMultiTurn),
      "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n6<|im_end|>\n");
  const json think = json::array({{{"role", "user"}, {"content", "q"}},
                                  {{"role", "assistant"}, {"content", "<think>\nplan\n</think>\n\nanswer"}}});
  EXPECT_EQ(chat_text(t, think),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nplan\n</think>\n\nanswer<|im_end|>\n");
  EXPECT_EQ(chat_text(t, kUnicodeEmpty),
            "<|im_start|>user\n  h\xC3\xA9llo \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 <|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n");
}

TEST(ChatTemplates, Mistral) {
  const ChatTemplate v1 = real("mistral-v0.1.jinja", "<s>", "</s>");
  EXPECT_EQ(chat_text(v1, kMultiTurn), "<s>[INST] 2+2? [/INST]4</s>[INST] and 3+3? [/INST]6</s>");
  try {
    chat_text(v1, kSystemChat);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos) << e.what();
  }
  const ChatTemplate v3 = real("mistral-v0.3.jinja", "<s>", "</s>");
  EXPECT_EQ(chat_text(v3, kMultiTurn), "<s>[INST] 2+2?[/INST] 4</s>[INST] and 3+3?[/INST] 6</s>");
  // The system message goes into the last user message only; this chat ends with the assistant.
  EXPECT_EQ(chat_text(v3, kSystemChat), "<s>[INST] Hi there[/INST] Hello! How can I help?</s>");
  const json sys_last = json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}});
  EXPECT_EQ(chat_text(v3, sys_last), "<s>[INST] S\n\nU[/INST]");
}

// ---- assistant spans and masks

// A byte-level tokenizer (tests/data/tokenizer/llama3.json) with the chat templates' special tokens.
Tokenizer chat_tokenizer() { return Tokenizer::parse(test::chat_tokenizer_json().dump(), "chat_tokenizer.json"); }

std::string spans_text(const ChatRendering& r) {
  std::string out;
  for (const auto& [a, b] : r.assistant) out += "[" + r.text.substr(a, b - a) + "]";
  return out;
}

TEST(ChatMasks, AssistantSpansOfRealTemplates) {
  EXPECT_EQ(spans_text(render_chat(real("llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>"), kMultiTurn, kNow, "t")),
            "[4<|eot_id|>][6<|eot_id|>]");
  EXPECT_EQ(spans_text(render_chat(real("qwen2.5.jinja", "", "<|im_end|>"), kMultiTurn, kNow, "t")),
            "[\n4<|im_end|>\n][\n6<|im_end|>\n]");
  // Qwen3: the think block only in the last turn; earlier turns are found in the full text.
  EXPECT_EQ(spans_text(render_chat(real("qwen3.jinja", "", "<|im_end|>"), kMultiTurn, kNow, "t")),
            "[4<|im_end|>\n][<think>\n\n</think>\n\n6<|im_end|>\n]");
  EXPECT_EQ(spans_text(render_chat(real("mistral-v0.1.jinja", "<s>", "</s>"), kMultiTurn, kNow, "t")),
            "[4</s>][6</s>]");
  EXPECT_EQ(spans_text(render_chat(real("mistral-v0.3.jinja", "<s>", "</s>"), kMultiTurn, kNow, "t")),
            "[ 4</s>][ 6</s>]");
  // Mistral v0.3 with a system message: the conversation before the turn renders differently
  // alone (the system message joins the last user message); the content markers find the turn.
  EXPECT_EQ(spans_text(render_chat(real("mistral-v0.3.jinja", "<s>", "</s>"), kSystemChat, kNow, "t")),
            "[Hello! How can I help?</s>]");
  EXPECT_EQ(
      spans_text(render_chat(real("llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>"), kUnicodeEmpty, kNow, "t")),
      "[<|eot_id|>]");
  // {% generation %} markers are used when the template has them.
  const ChatTemplate g = ChatTemplate::parse(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}!{% "
      "endgeneration %}"
      "{% else %}{{ m.content }}{% endif %}{% endfor %}",
      "gen.jinja");
  EXPECT_EQ(spans_text(render_chat(g, kMultiTurn, kNow, "t")), "[4!][6!]");
}

TEST(ChatMasks, LabelsFollowTokens) {
  const Tokenizer tok = chat_tokenizer();
  const ChatTemplate t = real("qwen2.5.jinja", "", "<|im_end|>");
  const ChatRendering r = render_chat(t, kMultiTurn, kNow, "t");
  const std::vector<int32_t> ids = tok.encode(r.text, false);
  const std::vector<int32_t> labels = assistant_labels(tok, r, ids);
  ASSERT_EQ(labels.size(), ids.size());
  // The labelled tokens decode to exactly the assistant turns.
  std::string trained;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (labels[k] == kIgnoreIndex) continue;
    EXPECT_EQ(labels[k], ids[k]);
    trained += tok.decode({ids[k]});
  }
  EXPECT_EQ(trained, "\n4<|im_end|>\n\n6<|im_end|>\n");
}

// Issue 16: chats transformers renders are rendered, with the turns after their headers.
TEST(ChatMasks, AssistantFirstAndConsecutiveTurns) {
  const json asst_first = json::array({{{"role", "assistant"}, {"content", "Hi! Ask me."}},
                                       {{"role", "user"}, {"content", "2+2?"}},
                                       {{"role", "assistant"}, {"content", "4"}}});
  // messages[:0] is refused by templates that read messages[0]: the turn is still found.
  const ChatTemplate reads_first = ChatTemplate::parse(
      "{% if messages[0]['role'] == 'system' %}S{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}</>"
      "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
      "first.jinja");
  EXPECT_EQ(spans_text(render_chat(reads_first, asst_first, kNow, "t")), "[Hi! Ask me.</>][4</>]");
  EXPECT_EQ(spans_text(render_chat(real("qwen2.5.jinja", "", "<|im_end|>"), asst_first, kNow, "t")),
            "[\nHi! Ask me.<|im_end|>\n][\n4<|im_end|>\n]");
  EXPECT_EQ(spans_text(render_chat(real("llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>"), asst_first, kNow, "t")),
            "[Hi! Ask me.<|eot_id|>][4<|eot_id|>]");
  // Qwen3, two assistant messages in a row: the last one's <think> block is part of its turn.
  const json consecutive = json::array({{{"role", "user"}, {"content", "q"}},
                                        {{"role", "assistant"}, {"content", "A"}},
                                        {{"role", "assistant"}, {"content", "B"}}});
  EXPECT_EQ(spans_text(render_chat(real("qwen3.jinja", "", "<|im_end|>"), consecutive, kNow, "t")),
            "[A<|im_end|>\n][<think>\n\n</think>\n\nB<|im_end|>\n]");
  // Mistral v0.3 with a system message: content with an emoji, the marker byte, or nothing.
  const ChatTemplate v3 = real("mistral-v0.3.jinja", "<s>", "</s>");
  for (const std::string& c : {std::string("\xF0\x9F\x98\x80 ok"), std::string("\x02 x \x02"), std::string("")}) {
    const json chat = json::array({{{"role", "system"}, {"content", "S"}},
                                   {{"role", "user"}, {"content", "U"}},
                                   {{"role", "assistant"}, {"content", c}}});
    const ChatRendering r = render_chat(v3, chat, kNow, "t");
    EXPECT_EQ(spans_text(r), "[" + c + "</s>]") << r.text;
  }
}

// The first Llama 3 template writes the generation prompt whatever add_generation_prompt says:
// the next turn's header is not trained (found against TRL's tagged Llama 3 template: every turn
// ended with the following "<|start_header_id|>" or the whole trailing prompt).
TEST(ChatMasks, AlwaysAppendedGenerationPromptIsNotTrained) {
  const ChatTemplate l3 = real("llama3.jinja", "<|begin_of_text|>", "<|end_of_text|>");
  EXPECT_EQ(spans_text(render_chat(l3, kMultiTurn, kNow, "t")), "[4<|eot_id|>][6<|eot_id|>]");
  EXPECT_EQ(spans_text(render_chat(l3, kSystemChat, kNow, "t")), "[Hello! How can I help?<|eot_id|>]");
  const json asst_first = json::array({{{"role", "assistant"}, {"content", "Hi! Ask me."}},
                                       {{"role", "user"}, {"content", "2+2?"}},
                                       {{"role", "assistant"}, {"content", "4"}}});
  EXPECT_EQ(spans_text(render_chat(l3, asst_first, kNow, "t")), "[Hi! Ask me.<|eot_id|>][4<|eot_id|>]");
  const json consecutive = json::array({{{"role", "user"}, {"content", "q"}},
                                        {{"role", "assistant"}, {"content", "A"}},
                                        {{"role", "assistant"}, {"content", "B"}}});
  EXPECT_EQ(spans_text(render_chat(l3, consecutive, kNow, "t")), "[A<|eot_id|>][B<|eot_id|>]");
  // A template that honours the flag keeps the whole turn (nothing is cut from its end).
  const ChatTemplate honours = ChatTemplate::parse(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</>{% endfor %}{% if add_generation_prompt %}<assistant>"
      "{% endif %}",
      "honours.jinja");
  EXPECT_EQ(spans_text(render_chat(honours, kMultiTurn, kNow, "t")), "[4</>][6</>]");
}

// Qwen2.5's and DeepSeek-V3's own templates: the turn starts where TRL's generation-tagged
// training template of the family starts its block (Qwen2.5: the newline after the role;
// DeepSeek-V3: the whole header); a copy of the
// template with one byte changed is not the family's and keeps the plain rule.
TEST(ChatMasks, TrlHeaderConventionsOfKnownTemplates) {
  const std::string bos = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  const std::string eos = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  const std::string asst = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
  const ChatTemplate ds = real("deepseek-v3.jinja", bos, eos);
  EXPECT_EQ(ds.turn_start, ChatTemplate::TurnStart::WithHeader);
  EXPECT_EQ(spans_text(render_chat(ds, kMultiTurn, kNow, "t")), "[" + asst + "4" + eos + "][" + asst + "6" + eos + "]");
  const json tool = json::array({{{"role", "user"}, {"content", "q"}},
                                 {{"role", "assistant"}, {"content", nullptr},
                                  {"tool_calls", json::array({{{"type", "function"},
                                                               {"function", {{"name", "f"}, {"arguments", "{}"}}}}})}},
                                 {{"role", "tool"}, {"content", "ok"}},
                                 {{"role", "assistant"}, {"content", "Done."}}});
  const ChatRendering r = render_chat(ds, tool, kNow, "t");
  ASSERT_EQ(r.assistant.size(), 2u) << r.text;
  const std::string after_tool = r.text.substr(r.assistant[1].first, r.assistant[1].second - r.assistant[1].first);
  // After tool results the model's template writes the end-of-outputs marker where the conversation
  // before the message ends (TRL's writes it inside the turn): not trained here.
  EXPECT_EQ(after_tool, "Done." + eos);
  EXPECT_EQ(real("qwen2.5.jinja", "", "<|im_end|>").turn_start, ChatTemplate::TurnStart::HeaderNewline);
  EXPECT_EQ(real("qwen3.jinja", "", "<|im_end|>").turn_start, ChatTemplate::TurnStart::AfterHeader);
  const ChatTemplate changed = ChatTemplate::parse(read_file(kDir + "qwen2.5.jinja") + "{#-#}", "changed.jinja");
  EXPECT_EQ(changed.turn_start, ChatTemplate::TurnStart::AfterHeader);
  EXPECT_EQ(spans_text(render_chat(changed, kMultiTurn, kNow, "t")), "[4<|im_end|>\n][6<|im_end|>\n]");
}

TEST(ChatMasks, ToolCallsKeepTheirKeyOrder) {
  const ChatTemplate t = ChatTemplate::parse(
      "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function|tojson }}{% endfor %}"
      "{% else %}{{ m.content }}{% endif %};{% endfor %}",
      "tools.jinja");
  const jinja::Value msgs = chat_messages(
      R"({"messages": [{"role": "user", "content": "w?"}, {"role": "assistant", "content": null, "tool_calls": )"
      R"([{"type": "function", "function": {"name": "get", "arguments": {"city": "Paris", "days": 100000000000000000000}}}]}]})",
      "d.jsonl:1");
  const ChatRendering r = render_chat(t, msgs, kNow, "d.jsonl:1");
  EXPECT_EQ(r.text, R"(w?;{"name": "get", "arguments": {"city": "Paris", "days": 100000000000000000000}};)");
  try {
    chat_messages(R"({"messages": [)", "d.jsonl:2");
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("d.jsonl:2"), std::string::npos) << e.what();
  }
}

TEST(ChatMasks, TokensByCharacterOffsets) {
  const Tokenizer tok = chat_tokenizer();
  // Offsets spell the text; an added token spans its content.
  const std::string text = "<|im_start|>user\nh\xC3\xA9llo<|im_end|> x";
  std::vector<std::pair<size_t, size_t>> off;
  const std::vector<int32_t> ids = tok.encode_offsets(text, off);
  ASSERT_EQ(ids, tok.encode(text, false));
  ASSERT_EQ(off.size(), ids.size());
  size_t pos = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_EQ(off[k].first, pos);
    EXPECT_EQ(text.substr(off[k].first, off[k].second - off[k].first), tok.decode({ids[k]}));
    pos = off[k].second;
  }
  EXPECT_EQ(pos, text.size());
  // A turn ending inside a token labels that token (transformers' char_to_token): the turn "4 " ends
  // with the space of " and" (Llama 3 splits digits off: "Q", ":", " ", "4", " and", " more").
  ChatRendering r;
  r.text = "Q: 4 and more";
  const std::vector<int32_t> q = tok.encode(r.text, false);
  r.assistant = {{3, 5}};  // "4 "
  const std::vector<int32_t> labels = assistant_labels(tok, r, q);
  std::string trained;
  for (size_t k = 0; k < q.size(); ++k)
    if (labels[k] != kIgnoreIndex) trained += tok.decode({q[k]});
  EXPECT_EQ(trained, "4 and");
  // A normalizer that composes characters (NFC): offsets point into the original text; as in
  // tokenizers, the composed character stands for its first character and the mark it absorbed
  // belongs to no token.
  json j = test::chat_tokenizer_json();
  j["normalizer"] = {{"type", "NFC"}};
  const Tokenizer nfc = Tokenizer::parse(j.dump(), "nfc.json");
  const std::string decomposed = "x e\xCC\x81t\xC3\xA9 y";  // e + combining acute, then precomposed é
  const std::vector<int32_t> nids = nfc.encode_offsets(decomposed, off);
  ASSERT_EQ(nids, nfc.encode(decomposed, false));
  EXPECT_EQ(off.front().first, 0u);
  EXPECT_EQ(off.back().second, decomposed.size());
  for (size_t k = 1; k < off.size(); ++k) {
    const std::string gap = decomposed.substr(off[k - 1].second, off[k].first - off[k - 1].second);
    EXPECT_TRUE(gap.empty() || gap == "\xCC\x81") << k << ": [" << gap << "]";
  }
}

TEST(ChatTemplates, LoadFromModelDirectory) {
  test::TempDir d;
  // tokenizer_config.json with a list of named templates and AddedToken-style special tokens.
  json cfg = {
      {"bos_token", {{"content", "<B>"}, {"lstrip", false}}},
      {"eos_token", "<E>"},
      {"chat_template",
       json::array({{{"name", "tool_use"}, {"template", "tool"}},
                    {{"name", "default"}, {"template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}}})}};
  std::ofstream(d.path / "tokenizer_config.json") << cfg.dump();
  auto t = ChatTemplate::load(d.path.string());
  ASSERT_TRUE(t);
  EXPECT_EQ(chat_text(*t, kMultiTurn), "<B>2+2?<E>");
  // chat_template.jinja wins.
  std::ofstream(d.path / "chat_template.jinja") << "J{{ messages|length }}";
  t = ChatTemplate::load(d.path.string());
  ASSERT_TRUE(t);
  EXPECT_EQ(chat_text(*t, kMultiTurn), "J4");
  // A template outside the subset is refused naming the file and the construct.
  std::ofstream(d.path / "chat_template.jinja") << "x\n{% macro m() %}{% endmacro %}";
  try {
    ChatTemplate::load(d.path.string());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("chat_template.jinja"), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 2: unsupported statement 'macro'"), std::string::npos) << msg;
  }
  std::filesystem::remove(d.path / "chat_template.jinja");
  std::ofstream(d.path / "tokenizer_config.json") << json({{"eos_token", "x"}}).dump();
  EXPECT_FALSE(ChatTemplate::load(d.path.string()));
}

TEST(ChatTemplates, LongConversationsAreBounded) {
  // Finding the turns renders the conversation once per assistant message: quadratic in the
  // messages, bounded per record.
  ChatTemplate t = real("qwen2.5.jinja", "", "<|im_end|>");
  // The default budget and 20,000 messages in the ordinary build; under the sanitizers a hundredth of
  // the budget and a tenth of the messages (the whole conversation's rendering the same share of the
  // budget: the same stop, in the turns' renderings, reached 100x sooner).
  t.record_steps = test::heavy<uint64_t>(t.record_steps, t.record_steps / 100);
  const std::string budget = test::heavy<std::string>("50000000", "500000");
  const int pairs = test::heavy(10000, 1000);
  json msgs = json::array();
  for (int i = 0; i < pairs; ++i) {
    msgs.push_back({{"role", "user"}, {"content", "q"}});
    msgs.push_back({{"role", "assistant"}, {"content", "a"}});
  }
  try {
    render_chat(t, msgs, kNow, "long.jsonl:1");
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("long.jsonl:1: chat template "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the record takes more than " + budget + " steps to render (" +
                                         std::to_string(2 * pairs) + " messages)"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplates, BadMessagesAreInputErrors) {
  const ChatTemplate t = real("qwen2.5.jinja", "", "<|im_end|>");
  for (const json& m : {json::array(), json::array({1}), json::array({{{"content", "x"}}}),
                        json::array({{{"role", "user"}, {"content", 3}}}), json("text")}) {
    try {
      render_chat(t, m, kNow, "data.jsonl:7");
      ADD_FAILURE() << m.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("data.jsonl:7"), std::string::npos) << e.what();
    }
  }
}

// The recorded apply_chat_template corpus (tools/chat_template_parity.py --record, on a machine with
// transformers; tests/data/chat_corpus/*.jsonl): the text of every conversation of a template in
// tests/data/chat_templates, refusals, and the assistant turns against the recorded masks' characters
// (a turn lies inside the masked characters, and every masked stretch holds a turn).
TEST(ChatCorpus, MatchesTransformers) {
  const std::filesystem::path dir = std::string(SF_SOURCE_DIR) + "/tests/data/chat_corpus";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no recorded corpus in " << dir;
  size_t checked = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".jsonl") continue;
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line)) {
      const json rec = json::parse(line);
      const std::string name = rec["template"];
      if (!std::filesystem::exists(kDir + name)) continue;  // TRL's templates are not in the repository
      Dict special;
      if (rec["bos"].is_string()) special.emplace_back("bos_token", Value::str(rec["bos"]));
      if (rec["eos"].is_string()) special.emplace_back("eos_token", Value::str(rec["eos"]));
      const ChatTemplate t = ChatTemplate::parse(read_file(kDir + name), kDir + name, special);
      const std::string where = name + " " + rec["messages"].dump();
      const jinja::Value msgs = chat_messages(line, where);  // the line itself: key order, exact integers
      ++checked;
      if (rec.contains("error")) {
        EXPECT_THROW(render_chat(t, msgs, kNow, where), InputError) << where;
        continue;
      }
      // Templates that print today's date (Llama 3.1/3.2) were recorded on their day: render at it.
      std::time_t now = kNow;
      const std::string want = rec["text"];
      if (const size_t at = want.find("Today Date: "); at != std::string::npos) {
        std::tm tm{};
        std::istringstream(want.substr(at + 12, 11)) >> std::get_time(&tm, "%d %b %Y");
        now = timegm(&tm);
      }
      const ChatRendering r = render_chat(t, msgs, now, where);
      ASSERT_EQ(r.text, want) << where;
      // Character offsets (Python's) to bytes.
      std::vector<size_t> byte_of{0};
      for (size_t k = 0; k < r.text.size(); ++k)
        if ((static_cast<unsigned char>(r.text[k]) & 0xC0) != 0x80 && k > 0) byte_of.push_back(k);
      byte_of.push_back(r.text.size());
      std::vector<std::pair<size_t, size_t>> masked;
      for (const auto& m : rec["mask_chars"])
        masked.emplace_back(byte_of[std::min(m[0].get<size_t>(), byte_of.size() - 1)],
                            byte_of[std::min(m[1].get<size_t>(), byte_of.size() - 1)]);
      // tokenizers' offsets skip a combining mark that NFC composed into the character before it
      // (Qwen's normalizer): join masked ranges that only such marks separate.
      std::sort(masked.begin(), masked.end());
      for (size_t k = 1; k < masked.size();) {
        std::vector<uint32_t> cps;
        std::vector<size_t> offs;
        uni::decode_utf8(r.text.substr(masked[k - 1].second, masked[k].first - masked[k - 1].second), cps, offs);
        const bool marks = std::all_of(cps.begin(), cps.end(), [](uint32_t cp) { return uni::classes(cp) & uni::kM; });
        if (masked[k].first >= masked[k - 1].second && marks) {
          masked[k - 1].second = masked[k].second;
          masked.erase(masked.begin() + ptrdiff_t(k));
        } else {
          ++k;
        }
      }
      for (const auto& [a, b] : r.assistant) {
        const bool inside = std::any_of(masked.begin(), masked.end(), [&](auto m) { return m.first <= a && b <= m.second; });
        EXPECT_TRUE(inside) << where << ": turn [" << r.text.substr(a, b - a) << "] is not masked";
      }
      for (const auto& [a, b] : masked) {
        const bool holds = std::any_of(r.assistant.begin(), r.assistant.end(), [&](auto s) { return s.first < b && a < s.second; });
        EXPECT_TRUE(holds) << where << ": masked [" << r.text.substr(a, b - a) << "] holds no turn";
      }
    }
  }
  EXPECT_GT(checked, 0u);
}

}  // namespace
