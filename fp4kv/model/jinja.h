// Chat templates: the subset of Jinja2 that Hugging Face chat templates are written in,
// parsed once and rendered as transformers' apply_chat_template renders them
// (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls; tojson as
// json.dumps(ensure_ascii=False); raise_exception and strftime_now as globals).
//
// The subset: text, {{ }}, {% if/elif/else %}, {% for %} (unpacking, `if` filter, else,
// loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem, break, continue),
// {% set %} (names, tuples, namespace attributes, blocks), {% macro %} with defaults,
// {% raw %}, {% generation %}, comments, whitespace control; Python literals, arithmetic,
// comparisons, `in`, `and/or/not`, conditional expressions, slices; the filters, tests and
// str/dict methods that chat templates use (jinja_render.cpp lists them). Anything else is a
// TemplateError naming it, at parse or at render time, never output that differs silently.
// Known difference: upper/lower/title/capitalize map ASCII letters only.
//
// Invariants: render() is deterministic for its variables except strftime_now (the clock);
// it never writes more than kMaxOutputBytes and never runs more than kMaxSteps statements
// and expressions, so a looping template fails instead of hanging the server.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "fp4kv/model/jinja_value.h"

namespace fp4kv::model::jinja {

inline constexpr size_t kMaxOutputBytes = size_t(64) << 20;
inline constexpr long long kMaxSteps = 5'000'000;

// The template's own raise_exception(message): the input is what it refuses.
class RaisedError : public TemplateError {
 public:
  explicit RaisedError(const std::string& what) : TemplateError(what) {}
};

struct Node;

class Template {
 public:
  // Throws TemplateError("line N: ...") for syntax outside the subset.
  explicit Template(std::string_view source);
  // `variables`: a dict whose entries are the template's global names.
  std::string render(const Dict& variables) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Node>>> body_;
};

// A JSON text as a Value (objects keep their key order); throws TemplateError if malformed.
Value json_value(std::string_view json_text);

}  // namespace fp4kv::model::jinja
