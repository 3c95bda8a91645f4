// A Jinja subset interpreter for chat templates (rendered as transformers' apply_chat_template does:
// jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, loopcontrols, the
// `generation` block, raise_exception, strftime_now and a tojson that does not escape HTML).
// Bounded: the parser limits the nesting of statements and the depth of expression trees, and a
// render stops with a RenderError (naming the line) past any of RenderLimits, so a hostile template
// can neither hang nor exhaust the stack or the memory.
#pragma once
#include <cstdint>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "data/template/jinja_ast.h"
#include "data/template/jinja_value.h"

namespace sf::jinja {

struct RenderLimits {
  size_t max_output = size_t(256) << 20;  // bytes of rendered text
  uint64_t max_steps = 100'000'000;       // statements and expressions evaluated
  size_t max_items = size_t(1) << 24;     // elements of one built list or string (range(), `*`)
  // Bytes of all the strings and list slots the render builds or copies (a 16 MB string read 64
  // times counts 1 GiB): bounds memory and the time spent copying.
  uint64_t max_value_bytes = uint64_t(1) << 30;
  uint64_t max_iterations = 1'000'000;  // iterations of all the loops of one render
};

struct Rendered {
  std::string text;
  // Byte ranges of the text written inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation;
  uint64_t steps = 0;  // statements and expressions evaluated
};

class Template {
 public:
  Template() = default;
  // SyntaxError for a construct outside the subset.
  static Template parse(const std::string& source, const LexOptions& opt = {});
  // `vars` are the template's globals (messages, bos_token, add_generation_prompt, ...); `now` is
  // the time strftime_now formats. RenderError when the template raises or misbehaves.
  Rendered render(const Dict& vars, std::time_t now, const RenderLimits& limits = {}) const;
  bool has_generation() const { return has_generation_; }

 private:
  Body body_;
  bool has_generation_ = false;
};

}  // namespace sf::jinja
