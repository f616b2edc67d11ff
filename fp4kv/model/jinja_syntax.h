// The syntax tree of a chat template (jinja.h) and the parser that builds it. The parser
// follows Jinja2's lexer and grammar (operator precedence, `is` tests and `|` filters binding
// after postfix operators, whitespace control with `-`/`+`, and Hugging Face's environment:
// trim_blocks and lstrip_blocks on, line endings made "\n", one trailing newline dropped).
//
// Invariants: every Expr and Node carries the template line it starts on (1-based) for error
// messages; a statement outside the subset (include, import, extends, block, call, filter,
// with, recursive loops) is a TemplateError at parse time, never skipped.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp4kv/model/jinja_value.h"

namespace fp4kv::model::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,      // value
    name,         // name
    list,         // operands: the elements
    tuple,        // operands: the elements (a list at run time)
    dict,         // operands: key, value, key, value, ...
    attribute,    // operands[0].name
    subscript,    // operands[0][operands[1]]
    slice,        // operands[0][1:2:3], absent parts null
    call,         // operands[0](operands[1..], keywords)
    filter,       // operands[0] | name(operands[1..], keywords)
    test,         // operands[0] is [not] name(operands[1..], keywords)
    negate,       // -operands[0]
    positive,     // +operands[0]
    logical_not,  // not operands[0]
    logical_and,  // operands[0] and operands[1]
    logical_or,   // operands[0] or operands[1]
    binary,       // operands[0] name operands[1]: + - * / // % ** ~
    compare,      // operands[0] ops[0] operands[1] ops[1] ... (a chain): == != < <= > >= in notin
    conditional,  // operands[1] if operands[0] else operands[2] (null: undefined)
  };
  Kind kind = Kind::literal;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
  bool negated = false;  // `is not`
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    text,       // text, written as is
    output,     // {{ expr }}
    if_chain,   // branches: (condition, body); the else branch has a null condition
    for_loop,   // for targets in expr [if condition]: body [else else_body]
    set,        // set targets = expr, or set targets[0].attribute = expr
    set_block,  // set targets[0]: body rendered to a string
    macro,      // macro name(params): body
    break_loop,
    continue_loop,
    block,  // a body with no effect of its own (Hugging Face's {% generation %})
  };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;  // text; macro name
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // a macro's parameters and defaults (null: none)
};

// Parses a whole template; throws TemplateError("line N: ...") on a syntax error.
Body parse_template(std::string_view source);

}  // namespace fp4kv::model::jinja
