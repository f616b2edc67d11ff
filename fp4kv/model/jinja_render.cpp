// Rendering a parsed chat template (jinja_syntax.h) with Python's and Jinja2's semantics.
// Scopes follow Jinja: a for loop's body gets a fresh scope each iteration (a `set` inside
// does not outlive it; namespaces carry state across iterations), `if` has none, a macro
// sees the template's top level and its own arguments.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "fp4kv/model/jinja.h"
#include "fp4kv/model/jinja_syntax.h"
#include "fp4kv/model/unicode_text.h"

namespace fp4kv::model::jinja {

namespace {

constexpr int kMaxMacroDepth = 64;
constexpr int64_t kMaxRangeLength = 1'000'000;

// Positional and keyword arguments of a call, filter or test.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;

  // The i-th positional argument or the keyword `name`, else `fallback`.
  Value get(size_t i, const char* name, Value fallback = Value()) const {
    if (i < positional.size()) return positional[i];
    return keyword(name, std::move(fallback));
  }
  // The keyword `name` (an argument that is never positional), else `fallback`.
  Value keyword(const char* name, Value fallback = Value()) const {
    for (const auto& [k, v] : keywords)
      if (k == name) return v;
    return fallback;
  }
  size_t count() const { return positional.size() + keywords.size(); }
};

std::string expect_string(const Value& v, const char* what) {
  if (v.is_undefined()) throw_undefined(v);
  if (!v.is(Value::Kind::string))
    throw TemplateError(std::string(what) + " needs a string, got " + kind_name(v.kind()));
  return v.str();
}

int64_t expect_int(const Value& v, const char* what) {
  if (v.is(Value::Kind::boolean) || v.is(Value::Kind::integer)) return v.as_int();
  if (v.is_undefined()) throw_undefined(v);
  throw TemplateError(std::string(what) + " needs an integer, got " + kind_name(v.kind()));
}

// ---- Python's str operations over code points --------------------------------------------

bool is_python_space(char32_t c) { return is_whitespace(c) || (c >= 0x1c && c <= 0x1f); }

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::vector<char32_t> cps = code_points(s);
  std::vector<char32_t> set;
  const bool whitespace = chars.is_undefined() || chars.is(Value::Kind::none);
  if (!whitespace) set = code_points(expect_string(chars, "strip"));
  auto stripped = [&](char32_t c) {
    return whitespace ? is_python_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && stripped(cps[b])) ++b;
  if (right)
    while (e > b && stripped(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

List split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (sep.is_undefined() || sep.is(Value::Kind::none)) {  // runs of whitespace, ends dropped
    const std::vector<char32_t> cps = code_points(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_python_space(cps[i])) ++i;
      if (i == cps.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && is_python_space(cps[e - 1])) --e;
        out.push_back(Value::string(from_code_points(cps, i, e)));
        break;
      }
      const size_t b = i;
      while (i < cps.size() && !is_python_space(cps[i])) ++i;
      out.push_back(Value::string(from_code_points(cps, b, i)));
    }
    return out;
  }
  const std::string d = expect_string(sep, "split");
  if (d.empty()) throw TemplateError("split: empty separator");
  size_t from = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    const size_t at = s.find(d, from);
    if (at == std::string::npos) break;
    out.push_back(Value::string(s.substr(from, at - from)));
    from = at + d.size();
  }
  out.push_back(Value::string(s.substr(from)));
  return out;
}

std::string map_ascii(std::string s, int (*f)(int)) {
  for (char& c : s)
    if ((unsigned char)c < 0x80) c = char(f((unsigned char)c));
  return s;
}
int to_upper(int c) { return c >= 'a' && c <= 'z' ? c - 32 : c; }
int to_lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

std::string capitalize(const std::string& s) {
  std::string out = map_ascii(s, to_lower);
  if (!out.empty()) out[0] = char(to_upper((unsigned char)out[0]));
  return out;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool previous_letter = false;
  for (char& c : out) {
    const unsigned char u = (unsigned char)c;
    const bool letter = (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z');
    if (letter) c = char(previous_letter ? to_lower(u) : to_upper(u));
    previous_letter = letter;
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) throw TemplateError("replace: an empty pattern is not supported");
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out += s.substr(pos, at - pos) + to;
    pos = at + from.size();
  }
  return out + s.substr(pos);
}

bool affix_test(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string x = expect_string(a, prefix ? "startswith" : "endswith");
    return x.size() <= s.size() &&
           (prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0);
  };
  if (affix.is(Value::Kind::list)) return std::any_of(affix.items().begin(), affix.items().end(), one);
  return one(affix);
}

// ---- Python's operators ------------------------------------------------------------------

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::list: return v.items();
    case Value::Kind::dict: {
      List keys;
      for (const auto& e : v.entries()) keys.push_back(Value::string(e.first));
      return keys;
    }
    case Value::Kind::string: {
      List chars;
      const std::vector<char32_t> cps = code_points(v.str());
      for (size_t i = 0; i < cps.size(); ++i) chars.push_back(Value::string(from_code_points(cps, i, i + 1)));
      return chars;
    }
    case Value::Kind::undefined: return {};
    default: throw TemplateError(std::string("a ") + kind_name(v.kind()) + " is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::string: return container.str().find(expect_string(item, "'in' on a string")) != std::string::npos;
    case Value::Kind::list:
      return std::any_of(container.items().begin(), container.items().end(),
                         [&](const Value& v) { return equal(v, item); });
    case Value::Kind::dict:
    case Value::Kind::ns: return item.is(Value::Kind::string) && container.find(item.str()) != nullptr;
    case Value::Kind::undefined: return false;
    default: throw TemplateError(std::string("'in' needs a container, got ") + kind_name(container.kind()));
  }
}

// a op b on 64-bit integers; throws on overflow.
template <class Op>
int64_t checked(Op op, int64_t a, int64_t b) {
  int64_t r = 0;
  if (op(a, b, &r)) throw TemplateError("integer overflow");
  return r;
}
bool add_overflows(int64_t a, int64_t b, int64_t* r) { return __builtin_add_overflow(a, b, r); }
bool sub_overflows(int64_t a, int64_t b, int64_t* r) { return __builtin_sub_overflow(a, b, r); }
bool mul_overflows(int64_t a, int64_t b, int64_t* r) { return __builtin_mul_overflow(a, b, r); }

Value repeat(const Value& seq, int64_t n) {
  if (n > 0 && seq.is(Value::Kind::string) && seq.str().size() * size_t(n) > kMaxOutputBytes)
    throw TemplateError("a repeated string beyond the output limit");
  if (seq.is(Value::Kind::string)) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(out);
  }
  if (n > 0 && seq.items().size() * size_t(n) > size_t(kMaxRangeLength))
    throw TemplateError("a repeated list too long");
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(out);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(python_str(a) + python_str(b));
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  const bool ints = (a.is(Value::Kind::integer) || a.is(Value::Kind::boolean)) &&
                    (b.is(Value::Kind::integer) || b.is(Value::Kind::boolean));
  if (op == "+") {
    if (a.is(Value::Kind::string) && b.is(Value::Kind::string)) return Value::string(a.str() + b.str());
    if (a.is(Value::Kind::list) && b.is(Value::Kind::list)) {
      if (a.is_tuple() != b.is_tuple()) throw TemplateError("a list and a tuple cannot be added");
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.is_tuple() ? Value::tuple(out) : Value::list(out);
    }
  }
  if (op == "*" && (a.is(Value::Kind::string) || a.is(Value::Kind::list)) && (b.is(Value::Kind::integer)))
    return repeat(a, b.as_int());
  if (op == "*" && (b.is(Value::Kind::string) || b.is(Value::Kind::list)) && (a.is(Value::Kind::integer)))
    return repeat(b, a.as_int());
  if (!a.is_number() || !b.is_number())
    throw TemplateError("unsupported operand types for " + op + ": " + kind_name(a.kind()) + " and " +
                        kind_name(b.kind()));
  const int64_t x = a.as_int(), y = b.as_int();
  const double p = a.as_double(), q = b.as_double();
  if (op == "+") return ints ? Value::integer(checked(add_overflows, x, y)) : Value::floating(p + q);
  if (op == "-") return ints ? Value::integer(checked(sub_overflows, x, y)) : Value::floating(p - q);
  if (op == "*") return ints ? Value::integer(checked(mul_overflows, x, y)) : Value::floating(p * q);
  if (op == "/") {
    if (q == 0) throw TemplateError("division by zero");
    return Value::floating(p / q);
  }
  if (op == "//" || op == "%") {
    if (ints ? y == 0 : q == 0) throw TemplateError("integer division or modulo by zero");
    if (ints) {
      if (x == std::numeric_limits<int64_t>::min() && y == -1) throw TemplateError("integer overflow");
      int64_t quotient = x / y, remainder = x % y;
      if (remainder != 0 && ((remainder < 0) != (y < 0))) {
        --quotient;
        remainder += y;
      }
      return Value::integer(op == "//" ? quotient : remainder);
    }
    const double quotient = std::floor(p / q);
    return Value::floating(op == "//" ? quotient : p - quotient * q);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      int64_t out = 1;
      for (int64_t i = 0; i < y; ++i) out = checked(mul_overflows, out, x);
      return Value::integer(out);
    }
    return Value::floating(std::pow(p, q));
  }
  throw TemplateError("unknown operator " + op);
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  const int c = compare(a, b);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;  // ">="
}

// Jinja's getattr / getitem: a mapping's member, a sequence's element; a missing one is
// undefined. Reading anything from an undefined value is an error.
Value member(const Value& subject, const Value& key, const std::string& spelled) {
  if (subject.is_undefined()) throw_undefined(subject);
  if (subject.is_mapping() && key.is(Value::Kind::string)) {
    const Value* v = subject.find(key.str());
    return v ? *v : Value::undefined(spelled);
  }
  const bool sequence = subject.is(Value::Kind::list) || subject.is(Value::Kind::string);
  if (!sequence || !(key.is(Value::Kind::integer) || key.is(Value::Kind::boolean))) return Value::undefined(spelled);
  // Python's index: negative counts from the end.
  auto at = [&key](size_t n) { return key.as_int() < 0 ? key.as_int() + int64_t(n) : key.as_int(); };
  if (subject.is(Value::Kind::list)) {
    const int64_t i = at(subject.items().size());
    return i >= 0 && i < int64_t(subject.items().size()) ? subject.items()[size_t(i)] : Value::undefined(spelled);
  }
  const std::vector<char32_t> cps = code_points(subject.str());
  const int64_t i = at(cps.size());
  return i >= 0 && i < int64_t(cps.size()) ? Value::string(from_code_points(cps, size_t(i), size_t(i) + 1))
                                           : Value::undefined(spelled);
}

// Python's slice indices of a sequence of n elements.
std::vector<size_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step_v) {
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is(Value::Kind::none); };
  const int64_t step = given(step_v) ? expect_int(step_v, "a slice") : 1;
  if (step == 0) throw TemplateError("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = expect_int(v, "a slice");
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), e = clamp(stop, step > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(size_t(i));
  return out;
}

Value slice(const Value& subject, const Value& start, const Value& stop, const Value& step) {
  if (subject.is(Value::Kind::list)) {
    List out;
    for (size_t i : slice_indices(int64_t(subject.items().size()), start, stop, step))
      out.push_back(subject.items()[i]);
    return Value::list(out);
  }
  if (subject.is(Value::Kind::string)) {
    const std::vector<char32_t> cps = code_points(subject.str());
    std::string out;
    for (size_t i : slice_indices(int64_t(cps.size()), start, stop, step)) append_utf8(cps[i], out);
    return Value::string(out);
  }
  if (subject.is_undefined()) throw_undefined(subject);
  throw TemplateError(std::string("a ") + kind_name(subject.kind()) + " cannot be sliced");
}

// ---- tests ------------------------------------------------------------------------------

bool apply_test(const std::string& name, const Value& v, const Args& a) {
  using K = Value::Kind;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is(K::none);
  if (name == "boolean") return v.is(K::boolean);
  if (name == "true") return v.is(K::boolean) && v.as_bool();
  if (name == "false") return v.is(K::boolean) && !v.as_bool();
  if (name == "integer") return v.is(K::integer);
  if (name == "float") return v.is(K::floating);
  if (name == "number") return v.is_number();
  if (name == "string") return v.is(K::string);
  if (name == "mapping") return v.is(K::dict);
  if (name == "iterable") return v.is(K::list) || v.is(K::dict) || v.is(K::string) || v.is_undefined();
  if (name == "sequence") return v.is(K::list) || v.is(K::dict) || v.is(K::string);
  if (name == "callable") return v.is(K::macro) || v.is(K::function);
  if (name == "escaped") return false;
  if (name == "odd" || name == "even") {
    const int64_t i = expect_int(v, name.c_str());
    return ((i % 2) != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = expect_int(a.get(0, "num"), "divisibleby");
    if (d == 0) throw TemplateError("divisibleby 0");
    return expect_int(v, "divisibleby") % d == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string s = expect_string(v, name.c_str());
    return s == map_ascii(s, name == "lower" ? to_lower : to_upper);
  }
  const Value other = a.get(0, "other");
  if (name == "sameas") {
    // Python's `is`: None, True and False are singletons; other values are compared as
    // distinct objects (a template cannot hold two names for one object here).
    return v.kind() == other.kind() && (v.is(K::none) || v.is(K::boolean)) && equal(v, other);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other);
  if (name == "ne" || name == "!=") return !equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other) < 0;
  if (name == "le" || name == "<=") return compare(v, other) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other) > 0;
  if (name == "ge" || name == ">=") return compare(v, other) >= 0;
  if (name == "in") return contains(a.get(0, "seq"), v);
  throw TemplateError("the test '" + name + "' is not supported");
}

// ---- filters ----------------------------------------------------------------------------

Value apply_filter(const std::string& name, const Value& v, const Args& a);

Value attribute_path(const Value& v, const std::string& path) {
  Value out = v;
  size_t from = 0;
  while (true) {
    const size_t dot = path.find('.', from);
    const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    const bool index =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    out = member(out, index ? Value::integer(std::stoll(part)) : Value::string(part), part);
    if (dot == std::string::npos) return out;
    from = dot + 1;
  }
}

// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...)
Value select(const Value& v, const Args& a, bool by_attribute, bool keep) {
  Args test_args;
  size_t first = 0;
  std::string attribute;
  if (by_attribute) attribute = expect_string(a.get(first++, "attribute"), "selectattr");
  std::string test;
  if (first < a.positional.size()) test = expect_string(a.positional[first++], "select");
  test_args.positional.assign(a.positional.begin() + long(std::min(first, a.positional.size())), a.positional.end());
  List out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool pass = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(out);
}

Value map_filter(const Value& v, const Args& a) {
  List out;
  const Value attribute = a.keyword("attribute");
  if (!attribute.is_undefined()) {
    const std::string path = expect_string(attribute, "map");
    const Value fallback = a.keyword("default");
    for (const Value& item : iterate(v)) {
      Value x = attribute_path(item, path);
      out.push_back(x.is_undefined() && !fallback.is_undefined() ? fallback : x);
    }
    return Value::list(out);
  }
  if (a.positional.empty()) throw TemplateError("map needs a filter name or attribute=");
  const std::string filter = expect_string(a.positional[0], "map");
  Args rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keywords = a.keywords;
  for (const Value& item : iterate(v)) out.push_back(apply_filter(filter, item, rest));
  return Value::list(out);
}

Value tojson(const Value& v, const Args& a) {
  JsonStyle style;
  const Value indent = a.get(0, "indent");
  if (!indent.is_undefined() && !indent.is(Value::Kind::none)) style.indent = int(expect_int(indent, "tojson indent"));
  const Value separators = a.keyword("separators");
  if (separators.is(Value::Kind::list) && separators.items().size() == 2) {
    style.item_separator = expect_string(separators.items()[0], "tojson separators");
    style.key_separator = expect_string(separators.items()[1], "tojson separators");
  }
  style.sort_keys = truthy(a.keyword("sort_keys"));
  if (truthy(a.keyword("ensure_ascii"))) throw TemplateError("tojson: ensure_ascii=True is not supported");
  return Value::string(python_json(v, style));
}

Value sort_filter(const Value& v, const Args& a) {
  List items = iterate(v);
  const bool reverse = truthy(a.get(0, "reverse")), case_sensitive = truthy(a.get(1, "case_sensitive"));
  const Value attribute = a.get(2, "attribute");
  auto key = [&](const Value& x) {
    Value k = attribute.is_undefined() ? x : attribute_path(x, expect_string(attribute, "sort"));
    return !case_sensitive && k.is(Value::Kind::string) ? Value::string(map_ascii(k.str(), to_lower)) : k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? compare(key(y), key(x)) < 0 : compare(key(x), key(y)) < 0;
  });
  return Value::list(items);
}

Value indent_filter(const Value& v, const Args& a) {
  const std::string s = expect_string(v, "indent");
  const Value w = a.get(0, "width", Value::integer(4));
  const std::string pad =
      w.is(Value::Kind::string) ? w.str() : std::string(size_t(std::max<int64_t>(0, expect_int(w, "indent"))), ' ');
  const bool first = truthy(a.get(1, "first")), blank = truthy(a.get(2, "blank"));
  std::string out;
  size_t from = 0;
  bool first_line = true;
  while (from <= s.size()) {
    const size_t nl = s.find('\n', from);
    const std::string line = s.substr(from, nl == std::string::npos ? std::string::npos : nl - from);
    const bool indent = (first_line ? first : true) && (blank || !line.empty());
    out += (indent ? pad : "") + line;
    if (nl == std::string::npos) break;
    out += '\n';
    from = nl + 1;
    first_line = false;
  }
  return Value::string(out);
}

Value length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::string: return Value::integer(int64_t(code_points(v.str()).size()));
    case Value::Kind::list: return Value::integer(int64_t(v.items().size()));
    case Value::Kind::dict: return Value::integer(int64_t(v.entries().size()));
    case Value::Kind::undefined: return Value::integer(0);
    default: throw TemplateError(std::string("a ") + kind_name(v.kind()) + " has no length");
  }
}

Value number_filter(const Value& v, const Args& a, bool integer) {
  const Value fallback = a.get(0, "default", integer ? Value::integer(0) : Value::floating(0));
  if (v.is_number()) return integer ? Value::integer(int64_t(v.as_double())) : Value::floating(v.as_double());
  if (!v.is(Value::Kind::string)) return fallback;
  const std::string s = strip(v.str(), Value(), true, true);
  char* end = nullptr;
  if (integer) {
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return Value::integer(i);
  }
  const double d = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') return fallback;
  return integer ? Value::integer(int64_t(d)) : Value::floating(d);
}

Value string_filter(const std::string& name, const Value& v, const Args& a) {
  if (name == "string") return Value::string(python_str(v));
  const std::string s = expect_string(v.is_undefined() ? Value::string("") : v, name.c_str());
  if (name == "upper") return Value::string(map_ascii(s, to_upper));
  if (name == "lower") return Value::string(map_ascii(s, to_lower));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "title") return Value::string(title(s));
  if (name == "trim") return Value::string(strip(s, a.get(0, "chars"), true, true));
  if (name == "replace") {
    const Value count = a.get(2, "count");
    return Value::string(
        replace_all(s, expect_string(a.get(0, "old"), "replace"), expect_string(a.get(1, "new"), "replace"),
                    count.is_undefined() || count.is(Value::Kind::none) ? -1 : expect_int(count, "replace")));
  }
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Value::string(out);
  }
  if (name == "wordcount") return Value::integer(int64_t(split(s, Value(), -1).size()));
  throw TemplateError("the filter '" + name + "' is not supported");
}

Value apply_filter(const std::string& name, const Value& v, const Args& a) {
  if (name == "length" || name == "count") return length(v);
  if (name == "tojson") return tojson(v, a);
  if (name == "safe") return v;
  if (name == "default" || name == "d") {
    const bool use_default = truthy(a.get(1, "boolean")) ? !truthy(v) : v.is_undefined();
    return use_default ? a.get(0, "default_value", Value::string("")) : v;
  }
  if (name == "list") return Value::list(iterate(v));
  if (name == "first" || name == "last") {
    const List items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is(Value::Kind::string)) return slice(v, Value(), Value(), Value::integer(-1));
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(items);
  }
  if (name == "join") {
    const Value attribute = a.get(1, "attribute");
    std::string out;
    const std::string sep = python_str(a.get(0, "d", Value::string("")));
    bool first = true;
    for (const Value& item : iterate(v)) {
      out += (first ? "" : sep) +
             python_str(attribute.is_undefined() ? item : attribute_path(item, expect_string(attribute, "join")));
      first = false;
    }
    return Value::string(out);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (!v.is(Value::Kind::dict)) throw TemplateError("items needs a mapping");
    List out;
    for (const auto& [k, x] : v.entries()) out.push_back(Value::list({Value::string(k), x}));
    return Value::list(out);
  }
  if (name == "map") return map_filter(v, a);
  if (name == "select" || name == "reject") return select(v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select(v, a, true, name == "selectattr");
  if (name == "sort") return sort_filter(v, a);
  if (name == "unique") {
    List out;
    for (const Value& x : iterate(v))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value::list(out);
  }
  if (name == "indent") return indent_filter(v, a);
  if (name == "int" || name == "float") return number_filter(v, a, name == "int");
  if (name == "abs") {
    if (v.is(Value::Kind::floating)) return Value::floating(std::fabs(v.as_double()));
    const int64_t i = expect_int(v, "abs");
    if (i == std::numeric_limits<int64_t>::min()) throw TemplateError("integer overflow");
    return Value::integer(i < 0 ? -i : i);
  }
  if (name == "round") {
    const double scale = std::pow(10.0, double(expect_int(a.get(0, "precision", Value::integer(0)), "round")));
    const std::string method = expect_string(a.get(1, "method", Value::string("common")), "round");
    const double x = v.as_double() * scale;
    const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
    return Value::floating(r / scale);
  }
  if (name == "sum") {
    Value total = a.get(1, "start", Value::integer(0));
    const Value attribute = a.get(0, "attribute");
    for (const Value& x : iterate(v))
      total = arithmetic("+", total, attribute.is_undefined() ? x : attribute_path(x, expect_string(attribute, "sum")));
    return total;
  }
  if (name == "min" || name == "max") {
    const List items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    Value best = items[0];
    for (const Value& x : items) {
      const int c = compare(x, best);
      if (name == "min" ? c < 0 : c > 0) best = x;
    }
    return best;
  }
  return string_filter(name, v, a);
}

// ---- methods of str and dict values -------------------------------------------------------

Value string_method(const std::string& s, const std::string& name, const Args& a) {
  if (name == "startswith" || name == "endswith")
    return Value::boolean(affix_test(s, a.get(0, "prefix"), name == "startswith"));
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(strip(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
  if (name == "split") {
    const Value maxsplit = a.get(1, "maxsplit", Value::integer(-1));
    return Value::list(split(s, a.get(0, "sep"), expect_int(maxsplit, "split")));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
    return string_filter(name, Value::string(s), a);
  if (name == "replace") return string_filter("replace", Value::string(s), a);
  if (name == "find" || name == "count") {
    const std::string x = expect_string(a.get(0, "sub"), name.c_str());
    if (name == "find") {
      const size_t at = s.find(x);
      return Value::integer(at == std::string::npos ? -1 : int64_t(code_points(s.substr(0, at)).size()));
    }
    if (x.empty()) return Value::integer(int64_t(code_points(s).size()) + 1);
    int64_t n = 0;
    for (size_t at = s.find(x); at != std::string::npos; at = s.find(x, at + x.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& item : iterate(a.get(0, "iterable"))) {
      out += (first ? "" : s) + expect_string(item, "join");
      first = false;
    }
    return Value::string(out);
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha") {
    const std::vector<char32_t> cps = code_points(s);
    auto ok = [&](char32_t c) {
      return name == "isdigit" ? (c >= '0' && c <= '9') : name == "isspace" ? is_python_space(c) : is_letter(c);
    };
    return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), ok));
  }
  throw TemplateError("the string method '" + name + "' is not supported");
}

Value dict_method(const Value& d, const std::string& name, const Args& a) {
  if (name == "get") {
    const Value* v = d.find(expect_string(a.get(0, "key"), "get"));
    return v ? *v : a.get(1, "default", Value::none());
  }
  if (name == "items") return apply_filter("items", d, Args{});
  if (name == "keys") return Value::list(iterate(d));
  if (name == "values") {
    List out;
    for (const auto& e : d.entries()) out.push_back(e.second);
    return Value::list(out);
  }
  throw TemplateError("the dict method '" + name + "' is not supported");
}

// ---- built-in functions -------------------------------------------------------------------

Value range(const Args& a) {
  int64_t start = 0, stop = 0, step = 1;
  if (a.positional.size() == 1) {
    stop = expect_int(a.positional[0], "range");
  } else if (a.positional.size() == 2 || a.positional.size() == 3) {
    start = expect_int(a.positional[0], "range");
    stop = expect_int(a.positional[1], "range");
    if (a.positional.size() == 3) step = expect_int(a.positional[2], "range");
  } else {
    throw TemplateError("range takes 1 to 3 integers");
  }
  if (step == 0) throw TemplateError("range step cannot be zero");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (int64_t(out.size()) >= kMaxRangeLength) throw TemplateError("range too long");
    out.push_back(Value::integer(i));
  }
  return Value::list(out);
}

Value strftime_now(const Args& a) {
  const std::string format = expect_string(a.get(0, "format"), "strftime_now");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
  return Value::string(std::string(buf, n));
}

Value call_function(const std::string& name, const Args& a) {
  if (name == "range") return range(a);
  if (name == "namespace" || name == "dict") {
    Dict entries;
    if (!a.positional.empty()) {
      if (a.positional.size() != 1 || !a.positional[0].is(Value::Kind::dict))
        throw TemplateError(name + " takes keyword arguments (or one dict)");
      entries = a.positional[0].entries();
    }
    for (const auto& kw : a.keywords) entries.push_back(kw);
    return name == "namespace" ? Value::ns(entries) : Value::dict(entries);
  }
  if (name == "raise_exception") throw RaisedError(python_str(a.get(0, "message")));
  if (name == "strftime_now") return strftime_now(a);
  throw TemplateError("the function '" + name + "' is not supported");
}

bool is_builtin(const std::string& name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" ||
         name == "strftime_now";
}

// ---- the renderer -------------------------------------------------------------------------

class Renderer {
 public:
  explicit Renderer(const Dict& globals) : globals_(globals) { scopes_.emplace_back(); }

  std::string run(const Body& body) {
    std::string out;
    if (render(body, out) != Flow::normal) throw TemplateError("break or continue outside a loop");
    return out;
  }

 private:
  enum class Flow { normal, break_loop, continue_loop };

  Flow render(const Body& body, std::string& out) {
    for (const auto& n : body) {
      Flow f = Flow::normal;
      try {
        f = render_node(*n, out);
      } catch (const RaisedError&) {
        throw;
      } catch (const TemplateError& e) {
        const std::string what = e.what();
        if (what.rfind("line ", 0) == 0) throw;
        throw TemplateError("line " + std::to_string(n->line) + ": " + what);
      }
      if (out.size() > kMaxOutputBytes)
        throw TemplateError("the output exceeds " + std::to_string(kMaxOutputBytes) + " bytes");
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow render_node(const Node& n, std::string& out) {
    step();
    switch (n.kind) {
      case Node::Kind::text: out += n.text; return Flow::normal;
      case Node::Kind::output: {
        const Value v = eval(*n.expr);
        out += python_str(v);
        return Flow::normal;
      }
      case Node::Kind::if_chain:
        for (const auto& [condition, body] : n.branches)
          if (!condition || truthy(eval(*condition))) return render(body, out);
        return Flow::normal;
      case Node::Kind::for_loop: return render_for(n, out);
      case Node::Kind::set: assign(n, eval(*n.expr)); return Flow::normal;
      case Node::Kind::set_block: {
        std::string captured;
        if (render(n.body, captured) != Flow::normal) throw TemplateError("break or continue inside a set block");
        assign(n, Value::string(captured));
        return Flow::normal;
      }
      case Node::Kind::macro: set_local(n.text, Value::macro(&n)); return Flow::normal;
      case Node::Kind::break_loop: return Flow::break_loop;
      case Node::Kind::continue_loop: return Flow::continue_loop;
      case Node::Kind::block: return render(n.body, out);
    }
    return Flow::normal;
  }

  // Binds `targets` to `v` in the innermost scope (unpacking a list for several names).
  void bind(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      set_local(targets[0], v);
      return;
    }
    if (!v.is(Value::Kind::list) || v.items().size() != targets.size())
      throw TemplateError("cannot unpack " + std::string(kind_name(v.kind())) + " into " +
                          std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) set_local(targets[i], v.items()[i]);
  }

  void assign(const Node& n, const Value& v) {
    if (n.attribute.empty()) return bind(n.targets, v);
    const Value target = lookup(n.targets[0]);
    if (!target.is(Value::Kind::ns))
      throw TemplateError("'" + n.targets[0] + "." + n.attribute + "' can be set only on a namespace()");
    target.set_member(n.attribute, v);
  }

  void set_local(const std::string& name, const Value& v) { set_entry(scopes_.back(), name, v); }

  Flow render_for(const Node& n, std::string& out) {
    List items = iterate(eval(*n.expr));
    if (n.condition) {
      List kept;
      for (const Value& item : items) {
        step();
        scopes_.emplace_back();
        bind(n.targets, item);
        const bool keep = truthy(eval(*n.condition));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return render(n.else_body, out);
    const int64_t count = int64_t(items.size());
    for (int64_t i = 0; i < count; ++i) {
      step();
      Dict loop{{"index", Value::integer(i + 1)},
                {"index0", Value::integer(i)},
                {"revindex", Value::integer(count - i)},
                {"revindex0", Value::integer(count - i - 1)},
                {"first", Value::boolean(i == 0)},
                {"last", Value::boolean(i == count - 1)},
                {"length", Value::integer(count)},
                {"depth", Value::integer(1)},
                {"depth0", Value::integer(0)},
                {"previtem", i > 0 ? items[size_t(i - 1)] : Value::undefined("loop.previtem")},
                {"nextitem", i + 1 < count ? items[size_t(i + 1)] : Value::undefined("loop.nextitem")}};
      scopes_.emplace_back();
      scopes_.back().emplace_back("loop", Value::dict(std::move(loop)));
      bind(n.targets, items[size_t(i)]);
      const Flow f = render(n.body, out);
      scopes_.pop_back();
      if (f == Flow::break_loop) break;
    }
    return Flow::normal;
  }

  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope)
      for (const auto& [k, v] : *scope)
        if (k == name) return v;
    for (const auto& [k, v] : globals_)
      if (k == name) return v;
    if (is_builtin(name)) return Value::function(name);
    return Value::undefined(name);
  }

  void step() {
    if (++steps_ > kMaxSteps)
      throw TemplateError("the template runs too long (more than " + std::to_string(kMaxSteps) + " steps)");
  }

  Value eval(const Expr& e) {
    step();
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List items;
        for (const auto& x : e.operands) items.push_back(eval(*x));
        return e.kind == Expr::Kind::tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
      }
      case Expr::Kind::dict: {
        Dict entries;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2)
          entries.emplace_back(expect_string(eval(*e.operands[i]), "a dict key"), eval(*e.operands[i + 1]));
        return Value::dict(std::move(entries));
      }
      case Expr::Kind::attribute: return member(eval(*e.operands[0]), Value::string(e.name), e.name);
      case Expr::Kind::subscript: {
        const Value subject = eval(*e.operands[0]);
        const Value key = eval(*e.operands[1]);
        return member(subject, key, python_str(key));
      }
      case Expr::Kind::slice: {
        auto part = [&](size_t i) { return e.operands[i] ? eval(*e.operands[i]) : Value(); };
        return slice(eval(*e.operands[0]), part(1), part(2), part(3));
      }
      case Expr::Kind::call: return call(e);
      case Expr::Kind::filter: return apply_filter(e.name, eval(*e.operands[0]), arguments(e));
      case Expr::Kind::test: return Value::boolean(apply_test(e.name, eval(*e.operands[0]), arguments(e)) != e.negated);
      case Expr::Kind::negate:
      case Expr::Kind::positive: {
        const Value v = eval(*e.operands[0]);
        if (!v.is_number())
          throw TemplateError(std::string("bad operand for unary ") + (e.kind == Expr::Kind::negate ? "-" : "+"));
        if (e.kind == Expr::Kind::positive) return v.is(Value::Kind::floating) ? v : Value::integer(v.as_int());
        return arithmetic("-", Value::integer(0), v);
      }
      case Expr::Kind::logical_not: return Value::boolean(!truthy(eval(*e.operands[0])));
      case Expr::Kind::logical_and: {
        Value a = eval(*e.operands[0]);
        return truthy(a) ? eval(*e.operands[1]) : a;
      }
      case Expr::Kind::logical_or: {
        Value a = eval(*e.operands[0]);
        return truthy(a) ? a : eval(*e.operands[1]);
      }
      case Expr::Kind::binary: return arithmetic(e.name, eval(*e.operands[0]), eval(*e.operands[1]));
      case Expr::Kind::compare: {
        Value left = eval(*e.operands[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.operands[i + 1]);
          if (!compare_op(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::conditional:
        if (truthy(eval(*e.operands[0]))) return eval(*e.operands[1]);
        return e.operands[2] ? eval(*e.operands[2]) : Value();
    }
    return Value();
  }

  // Arguments of a call, filter or test: operands[1..] and the keywords.
  Args arguments(const Expr& e) {
    Args a;
    for (size_t i = 1; i < e.operands.size(); ++i) a.positional.push_back(eval(*e.operands[i]));
    for (const auto& [k, x] : e.keywords) a.keywords.emplace_back(k, eval(*x));
    return a;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.operands[0];
    if (callee.kind != Expr::Kind::attribute) return call_value(eval(callee), e);
    const Value subject = eval(*callee.operands[0]);  // a method of a str or dict value, or a member
    if (subject.is(Value::Kind::string)) return string_method(subject.str(), callee.name, arguments(e));
    if (subject.is(Value::Kind::dict)) {
      const Value* member_value = subject.find(callee.name);
      if (!member_value || !(member_value->is(Value::Kind::macro) || member_value->is(Value::Kind::function)))
        return dict_method(subject, callee.name, arguments(e));
    }
    if (subject.is(Value::Kind::list))
      throw TemplateError("the list method '" + callee.name + "' is not supported (lists are immutable in templates)");
    return call_value(member(subject, Value::string(callee.name), callee.name), e);
  }

  // Calls `f` (a built-in function or a macro) with the arguments of call expression `e`.
  Value call_value(const Value& f, const Expr& e) {
    if (f.is(Value::Kind::function)) return call_function(f.str(), arguments(e));
    if (f.is(Value::Kind::macro)) return call_macro(*f.definition(), arguments(e));
    if (f.is_undefined()) throw_undefined(f);
    throw TemplateError(std::string("a ") + kind_name(f.kind()) + " is not callable");
  }

  Value call_macro(const Node& m, const Args& a) {
    if (a.positional.size() > m.params.size())
      throw TemplateError("macro '" + m.text + "' takes " + std::to_string(m.params.size()) + " arguments");
    if (++macro_depth_ > kMaxMacroDepth) throw TemplateError("macro calls nested too deep");
    std::vector<Dict> saved = std::move(scopes_);
    scopes_ = {saved.front(), Dict{}};
    try {
      for (const auto& [k, v] : a.keywords)
        if (std::none_of(m.params.begin(), m.params.end(), [&](const auto& p) { return p.first == k; }))
          throw TemplateError("macro '" + m.text + "' has no parameter '" + k + "'");
      for (size_t i = 0; i < m.params.size(); ++i) {
        const auto& [name, fallback] = m.params[i];
        Value v = a.get(i, name.c_str());
        if (v.is_undefined() && fallback) v = eval(*fallback);
        if (v.is_undefined()) v = Value::undefined(name);
        set_local(name, v);
      }
      std::string out;
      if (render(m.body, out) != Flow::normal) throw TemplateError("break or continue outside a loop");
      scopes_ = std::move(saved);
      --macro_depth_;
      return Value::string(out);
    } catch (...) {
      scopes_ = std::move(saved);
      --macro_depth_;
      throw;
    }
  }

  const Dict& globals_;
  std::vector<Dict> scopes_;  // [0] the template's top level
  long long steps_ = 0;
  int macro_depth_ = 0;
};

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) return Value::floating(double(u));
      return Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& x : j) items.push_back(from_json(x));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict entries;
      for (const auto& [k, x] : j.items()) entries.emplace_back(k, from_json(x));
      return Value::dict(std::move(entries));
    }
    default: throw TemplateError("a JSON value of an unsupported type");
  }
}

}  // namespace

Template::Template(std::string_view source) : body_(std::make_shared<const Body>(parse_template(source))) {}

std::string Template::render(const Dict& variables) const { return Renderer(variables).run(*body_); }

Value json_value(std::string_view json_text) {
  const auto j = nlohmann::ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw TemplateError("malformed JSON");
  return from_json(j);
}

}  // namespace fp4kv::model::jinja
