#include "fp4kv/model/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "fp4kv/model/unicode_text.h"

namespace fp4kv::model::jinja {

Value Value::undefined(std::string name) {
  Value v(Kind::undefined);
  v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

Value Value::none() { return Value(Kind::none); }

Value Value::boolean(bool b) {
  Value v(Kind::boolean);
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v(Kind::integer);
  v.i_ = i;
  return v;
}

Value Value::floating(double d) {
  Value v(Kind::floating);
  v.f_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v(Kind::string);
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::list(List items) {
  Value v(Kind::list);
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::dict(Dict entries) {
  Value v(Kind::dict);
  v.dict_ = std::make_shared<Dict>(std::move(entries));
  return v;
}

Value Value::ns(Dict entries) {
  Value v = dict(std::move(entries));
  v.kind_ = Kind::ns;
  return v;
}

Value Value::macro(const Node* definition) {
  Value v(Kind::macro);
  v.macro_ = definition;
  return v;
}

Value Value::function(std::string name) {
  Value v(Kind::function);
  v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

const Value* Value::find(std::string_view key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict_)
    if (k == key) return &v;
  return nullptr;
}

void Value::set_member(const std::string& key, Value v) const {
  if (kind_ != Kind::ns) throw TemplateError("only a namespace's attributes can be assigned");
  set_entry(*dict_, key, std::move(v));
}

void set_entry(Dict& entries, const std::string& key, Value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::undefined: return "undefined";
    case Value::Kind::none: return "none";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::list: return "list";
    case Value::Kind::dict: return "dict";
    case Value::Kind::ns: return "namespace";
    case Value::Kind::macro: return "macro";
    case Value::Kind::function: return "function";
  }
  return "?";
}

void throw_undefined(const Value& v) {
  const std::string name = v.undefined_name().empty() ? "a value" : "'" + v.undefined_name() + "'";
  throw TemplateError(name + " is undefined");
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: return false;
    case Value::Kind::boolean: return v.as_bool();
    case Value::Kind::integer: return v.as_int() != 0;
    case Value::Kind::floating: return v.as_double() != 0.0;
    case Value::Kind::string: return !v.str().empty();
    case Value::Kind::list: return !v.items().empty();
    case Value::Kind::dict: return !v.entries().empty();
    case Value::Kind::ns:
    case Value::Kind::macro:
    case Value::Kind::function: return true;
  }
  return false;
}

namespace {

bool is_integral(const Value& v) { return v.is(Value::Kind::boolean) || v.is(Value::Kind::integer); }

bool equal_dicts(const Dict& a, const Dict& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a) {
    const auto it = std::find_if(b.begin(), b.end(), [&](const auto& e) { return e.first == k; });
    if (it == b.end() || !equal(v, it->second)) return false;
  }
  return true;
}

}  // namespace

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string:
    case Value::Kind::function: return a.str() == b.str();
    case Value::Kind::list: {
      if (a.items().size() != b.items().size() || a.is_tuple() != b.is_tuple()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equal(a.items()[i], b.items()[i])) return false;
      return true;
    }
    case Value::Kind::dict: return equal_dicts(a.entries(), b.entries());
    case Value::Kind::ns: return &a.entries() == &b.entries();
    case Value::Kind::macro: return a.definition() == b.definition();
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y;
  }
  if (a.is(Value::Kind::string) && b.is(Value::Kind::string)) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0;
  }
  if (a.is(Value::Kind::list) && b.is(Value::Kind::list)) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (const int c = compare(x[i], y[i]); c != 0) return c;
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  throw TemplateError(std::string("'<' is not supported between ") + kind_name(a.kind()) + " and " +
                      kind_name(b.kind()));
}

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);  // shortest round trip
  const std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exponent = std::stoi(sci.substr(e + 1));
  const int point = exponent + 1;  // value = 0.<digits> x 10^point
  std::string out = negative ? "-" : "";
  if (point > 16 || point <= -4) {  // repr's switch to exponent notation
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + ex;
  }
  if (point <= 0) return out + "0." + std::string(size_t(-point), '0') + digits;
  if (size_t(point) >= digits.size()) return out + digits + std::string(size_t(point) - digits.size(), '0') + ".0";
  return out + digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = (unsigned char)s[i];
    if (c == '\\')
      out += "\\\\";
    else if (c == (unsigned char)quote)
      out += std::string("\\") + quote;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += char(c);
    }
  }
  return out + quote;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = (unsigned char)ch;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\u%04x", c);
          out += hex;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

void json_into(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  const std::string item_sep = !style.item_separator.empty() ? style.item_separator : style.indent >= 0 ? "," : ", ";
  const std::string key_sep = !style.key_separator.empty() ? style.key_separator : ": ";
  auto newline = [&](int d) {
    if (style.indent >= 0) out += "\n" + std::string(size_t(style.indent * d), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d);
      return;
    }
    case Value::Kind::string: out += json_string(v.str()); return;
    case Value::Kind::list: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        json_into(v.items()[i], style, depth + 1, out);
      }
      newline(depth);
      out += "]";
      return;
    }
    case Value::Kind::dict: {
      if (v.entries().empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.entries()) entries.push_back(&e);
      if (style.sort_keys)
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(depth + 1);
        out += json_string(entries[i]->first) + key_sep;
        json_into(entries[i]->second, style, depth + 1, out);
      }
      newline(depth);
      out += "}";
      return;
    }
    case Value::Kind::undefined: throw_undefined(v);
    default: throw TemplateError(std::string("a ") + kind_name(v.kind()) + " is not JSON serializable");
  }
}

}  // namespace

std::string python_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::string: return repr_string(v.str());
    case Value::Kind::list: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.items().size(); ++i) out += (i ? ", " : "") + python_repr(v.items()[i]);
      if (v.is_tuple()) return out + (v.items().size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Kind::dict: {
      std::string out = "{";
      for (size_t i = 0; i < v.entries().size(); ++i)
        out += (i ? ", " : "") + repr_string(v.entries()[i].first) + ": " + python_repr(v.entries()[i].second);
      return out + "}";
    }
    default: return python_str(v);
  }
}

std::string python_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined: return "";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return v.as_bool() ? "True" : "False";
    case Value::Kind::integer: return std::to_string(v.as_int());
    case Value::Kind::floating: return python_float(v.as_double());
    case Value::Kind::string: return v.str();
    case Value::Kind::list:
    case Value::Kind::dict: return python_repr(v);
    case Value::Kind::ns: return "<Namespace>";
    case Value::Kind::macro: return "<Macro>";
    case Value::Kind::function: return "<function " + v.str() + ">";
  }
  return "";
}

std::string python_json(const Value& v, const JsonStyle& style) {
  std::string out;
  json_into(v, style, 0, out);
  return out;
}

std::vector<char32_t> code_points(const std::string& s) { return decode_utf8(s, "a template string"); }

std::string from_code_points(const std::vector<char32_t>& cps, size_t first, size_t last) {
  std::string out;
  for (size_t i = first; i < last && i < cps.size(); ++i) append_utf8(cps[i], out);
  return out;
}

}  // namespace fp4kv::model::jinja
