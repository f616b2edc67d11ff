// The values of the chat-template language (jinja.h): Python's None, bool, int, float, str,
// list and dict (insertion-ordered, string keys), and Jinja's undefined, namespace, macro and
// built-in function, with Python's rules for truth, equality, order, str(), repr() and
// json.dumps(), which is what a template's output is made of.
//
// Invariants: a Value is immutable once built except a namespace, whose members `set ns.x`
// changes in place for every copy (Jinja's namespace() semantics); strings are UTF-8 and
// their length, indexing and slicing count code points, as Python's do; integers are 64-bit
// and arithmetic that overflows throws rather than wraps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp4kv/core/error.h"

namespace fp4kv::model::jinja {

// An error in a template or in rendering it (a syntax error, an undefined name used as a
// value, a type error, the template's own raise_exception).
class TemplateError : public Error {
 public:
  explicit TemplateError(const std::string& what) : Error(what) {}
};

struct Node;  // a macro's definition (jinja_syntax.h)
class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

class Value {
 public:
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, ns, macro, function };

  Value() = default;                         // undefined
  static Value undefined(std::string name);  // `name` is what the error message calls it
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double d);
  static Value string(std::string s);
  static Value list(List items);
  static Value tuple(List items);  // a list that prints as (a, b) and never equals a list
  static Value dict(Dict entries);
  static Value ns(Dict entries);
  static Value macro(const Node* definition);
  static Value function(std::string name);

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_number() const { return kind_ == Kind::boolean || kind_ == Kind::integer || kind_ == Kind::floating; }
  bool is_mapping() const { return kind_ == Kind::dict || kind_ == Kind::ns; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::boolean ? int64_t(b_) : i_; }  // boolean or integer
  double as_double() const { return kind_ == Kind::floating ? f_ : double(as_int()); }
  const std::string& str() const { return *s_; }  // a string's text, a function's name
  std::string undefined_name() const { return s_ ? *s_ : std::string(); }
  const List& items() const { return *list_; }
  bool is_tuple() const { return tuple_; }
  const Dict& entries() const { return *dict_; }  // dict or namespace
  const Node* definition() const { return macro_; }

  // A dict's or namespace's member, or nullptr.
  const Value* find(std::string_view key) const;
  // Sets a namespace's member (seen through every copy of the namespace).
  void set_member(const std::string& key, Value v) const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::undefined;
  bool b_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;  // mutable only through set_member, for namespaces
  const Node* macro_ = nullptr;
};

// Sets `key` in `entries` (replacing its value, or appending it: Python's dict order).
void set_entry(Dict& entries, const std::string& key, Value v);

const char* kind_name(Value::Kind k);
[[noreturn]] void throw_undefined(const Value& v);  // "'name' is undefined"

bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// Python's order: numbers with numbers, strings (by code point), lists lexicographically;
// anything else throws. Returns <0, 0, >0.
int compare(const Value& a, const Value& b);

std::string python_str(const Value& v);   // str(v); undefined is ""
std::string python_repr(const Value& v);  // repr(v)
std::string python_float(double d);       // repr(float)

// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...): what
// Hugging Face's tojson filter writes. indent < 0 is None.
struct JsonStyle {
  int indent = -1;
  std::string item_separator, key_separator;  // empty: Python's defaults for the indent
  bool sort_keys = false;
};
std::string python_json(const Value& v, const JsonStyle& style);

// Code points of a string value, and back.
std::vector<char32_t> code_points(const std::string& s);
std::string from_code_points(const std::vector<char32_t>& cps, size_t first, size_t last);

}  // namespace fp4kv::model::jinja
