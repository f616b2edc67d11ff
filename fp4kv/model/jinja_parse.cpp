#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "fp4kv/model/jinja_syntax.h"
#include "fp4kv/model/unicode_text.h"

namespace fp4kv::model::jinja {

namespace {

[[noreturn]] void fail(int line, const std::string& message) {
  throw TemplateError("line " + std::to_string(line) + ": " + message);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

int count_lines(std::string_view s) {
  int n = 0;
  for (const char c : s) n += c == '\n';
  return n;
}

// ---- The template's parts: text, {{ variable }} and {% block %} tags --------------------

struct Segment {
  enum class Kind { text, variable, block } kind;
  std::string content;
  int line;
};

// Jinja's source normalization: "\r\n" and "\r" become "\n", and one trailing newline goes
// (keep_trailing_newline is off).
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The end of a tag's content: the offset of `close` ("}}" or "%}") outside string literals
// and brackets (as Jinja's lexer balances them: `{{ {'a': {'b': 1}} }}` ends at the last "}}").
size_t find_tag_end(const std::string& s, size_t from, std::string_view close, int line) {
  int depth = 0;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\'' || c == '"') {
      for (++i; i < s.size() && s[i] != c; ++i)
        if (s[i] == '\\') ++i;
      continue;
    }
    if (depth == 0 && s.compare(i, close.size(), close) == 0) return i;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
  }
  fail(line, "a tag is not closed (no '" + std::string(close) + "')");
}

// The text of a {% raw %} block up to its {% endraw %}, and the offset after that tag.
std::pair<std::string, size_t> raw_text(const std::string& s, size_t from, int line) {
  for (size_t i = s.find("{%", from); i != std::string::npos; i = s.find("{%", i + 2)) {
    size_t j = i + 2;
    const bool strip_before = j < s.size() && s[j] == '-';
    if (j < s.size() && (s[j] == '-' || s[j] == '+')) ++j;
    while (j < s.size() && is_space(s[j])) ++j;
    if (s.compare(j, 6, "endraw") != 0) continue;
    j += 6;
    while (j < s.size() && is_space(s[j])) ++j;
    bool strip_after = false;
    if (j < s.size() && s[j] == '-') {
      strip_after = true;
      ++j;
    }
    if (s.compare(j, 2, "%}") != 0) continue;
    std::string text = s.substr(from, i - from);
    if (strip_before) text.erase(text.find_last_not_of(" \t\n\r\f\v") + 1);
    j += 2;
    if (strip_after)
      while (j < s.size() && is_space(s[j])) ++j;
    else if (j < s.size() && s[j] == '\n')
      ++j;
    return {text, j};
  }
  fail(line, "{% raw %} without {% endraw %}");
}

std::vector<Segment> scan(std::string_view template_source) {
  const std::string s = normalize_newlines(template_source);
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  auto emit_text = [&out](std::string text, int at) {
    if (!text.empty()) out.push_back({Segment::Kind::text, std::move(text), at});
  };
  while (pos < s.size()) {
    size_t start = pos;
    while ((start = s.find('{', start)) != std::string::npos && start + 1 < s.size() && s[start + 1] != '{' &&
           s[start + 1] != '%' && s[start + 1] != '#')
      ++start;
    if (start == std::string::npos || start + 1 >= s.size()) {
      emit_text(s.substr(pos), line);
      break;
    }
    const char type = s[start + 1];
    const char sign = start + 2 < s.size() ? s[start + 2] : '\0';
    std::string text = s.substr(pos, start - pos);
    if (sign == '-') {
      text.erase(text.find_last_not_of(" \t\n\r\f\v") + 1);
    } else if (sign != '+' && type != '{') {  // lstrip_blocks: a tag alone on its line from the left
      const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l_pos > 0 || line_starting) && text.find_first_not_of(" \t", l_pos) == std::string::npos) text.erase(l_pos);
    }
    const int text_line = line;
    line += count_lines(s.substr(pos, start - pos));
    emit_text(std::move(text), text_line);
    const int tag_line = line;
    const size_t content_start = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    size_t close = 0;
    if (type == '#') {
      close = s.find("#}", content_start);
      if (close == std::string::npos) fail(tag_line, "a comment is not closed (no '#}')");
    } else {
      close = find_tag_end(s, content_start, type == '{' ? "}}" : "%}", tag_line);
    }
    const bool strip_after = close > content_start && s[close - 1] == '-';
    const std::string content = s.substr(content_start, close - content_start - (strip_after ? 1 : 0));
    size_t after = close + 2;
    if (strip_after)
      while (after < s.size() && is_space(s[after])) ++after;
    else if (type != '{' && after < s.size() && s[after] == '\n')  // trim_blocks
      ++after;
    line += count_lines(s.substr(start, after - start));
    line_starting = s[after - 1] == '\n';
    pos = after;
    if (type == '{') out.push_back({Segment::Kind::variable, content, tag_line});
    if (type != '%') continue;
    const size_t first = content.find_first_not_of(" \t\n\r\f\v"), last = content.find_last_not_of(" \t\n\r\f\v");
    if (first != std::string::npos && content.substr(first, last - first + 1) == "raw") {
      auto [raw, next] = raw_text(s, pos, tag_line);
      line += count_lines(s.substr(pos, next - pos));
      emit_text(std::move(raw), tag_line);
      pos = next;
      line_starting = s[pos - 1] == '\n';
      continue;
    }
    out.push_back({Segment::Kind::block, content, tag_line});
  }
  return out;
}

// ---- Tokens of a tag's content ------------------------------------------------------------

struct Token {
  enum class Kind { name, string, integer, floating, op, end } kind;
  std::string text;  // a name, a string's value, an operator, a number's spelling
  int line;
};

// Python's unicode-escape decoding of a string literal's body, as Jinja reads it.
std::string unescape(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](size_t digits) {
      const std::string h(body.substr(i + 1, digits));
      if (h.size() != digits || h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        fail(line, "a malformed escape in a string literal");
      const unsigned long cp = std::strtoul(h.c_str(), nullptr, 16);
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail(line, "an escape outside Unicode's code points");
      i += digits;
      append_utf8(char32_t(cp), out);
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // a line continuation
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (c >= '0' && c <= '7') {  // up to three octal digits
          int v = 0, n = 0;
          for (; n < 3 && i < body.size() && body[i] >= '0' && body[i] <= '7'; ++n, ++i) v = v * 8 + (body[i] - '0');
          --i;
          append_utf8(char32_t(v), out);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

std::vector<Token> tokenize(const std::string& s, int line) {
  static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
  std::vector<Token> out;
  size_t i = 0;
  while (true) {
    while (i < s.size() && is_space(s[i])) line += s[i++] == '\n';
    if (i >= s.size()) break;
    const char c = s[i];
    if (is_name_start(c)) {
      const size_t b = i;
      while (i < s.size() && is_name_char(s[i])) ++i;
      out.push_back({Token::Kind::name, s.substr(b, i - b), line});
    } else if (is_digit(c)) {
      const size_t b = i;
      while (i < s.size() && (is_digit(s[i]) || s[i] == '_')) ++i;
      bool real = false;
      if (i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
        real = true;
        for (++i; i < s.size() && (is_digit(s[i]) || s[i] == '_');) ++i;
      }
      if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
        if (j < s.size() && is_digit(s[j])) {
          real = true;
          for (i = j; i < s.size() && is_digit(s[i]);) ++i;
        }
      }
      std::string digits;
      for (size_t k = b; k < i; ++k)
        if (s[k] != '_') digits += s[k];
      out.push_back({real ? Token::Kind::floating : Token::Kind::integer, digits, line});
    } else if (c == '\'' || c == '"') {
      const size_t b = ++i;
      while (i < s.size() && s[i] != c) i += s[i] == '\\' ? 2 : 1;
      if (i >= s.size()) fail(line, "a string literal is not closed");
      out.push_back({Token::Kind::string, unescape(std::string_view(s).substr(b, i - b), line), line});
      line += count_lines(s.substr(b, i - b));
      ++i;
    } else {
      const char* op = nullptr;
      for (const char* o : kOps)
        if (s.compare(i, std::char_traits<char>::length(o), o) == 0) {
          op = o;
          break;
        }
      if (!op) fail(line, std::string("unexpected character '") + c + "'");
      out.push_back({Token::Kind::op, op, line});
      i += std::char_traits<char>::length(op);
    }
  }
  out.push_back({Token::Kind::end, "", line});
  return out;
}

// ---- The parser -----------------------------------------------------------------------------

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// A node applied to `subject` (its first operand): an attribute, a call, a filter, a test.
ExprPtr make_applied(Expr::Kind kind, int line, ExprPtr subject, std::string name) {
  auto e = make(kind, line);
  e->name = std::move(name);
  e->operands.push_back(std::move(subject));
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body parse_all() {
    std::string stop;
    Body body = parse_body({}, stop);
    return body;
  }

 private:
  // ---- statements
  // Nodes up to a block tag whose keyword is in `stops` (stop = that keyword, the tag's
  // tokens current after it), or to the end of the template when `stops` is empty.
  Body parse_body(std::initializer_list<std::string_view> stops, std::string& stop) {
    Body body;
    while (next_ < segments_.size()) {
      const Segment& seg = segments_[next_++];
      if (seg.kind == Segment::Kind::text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::text;
        n->line = seg.line;
        n->text = seg.content;
        body.push_back(std::move(n));
        continue;
      }
      tokens_ = tokenize(seg.content, seg.line);
      at_ = 0;
      if (seg.kind == Segment::Kind::variable) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::output;
        n->line = seg.line;
        n->expr = parse_tuple(true);
        expect_end();
        body.push_back(std::move(n));
        continue;
      }
      if (peek().kind != Token::Kind::name) fail(seg.line, "a block tag must start with a keyword");
      const std::string keyword = take().text;
      for (std::string_view s : stops)
        if (keyword == s) {
          stop = keyword;
          return body;
        }
      body.push_back(parse_statement(keyword, seg.line));
    }
    if (stops.size() > 0)
      fail(segments_.empty() ? 1 : segments_.back().line, "missing {% " + std::string(*stops.begin()) + " %}");
    return body;
  }

  std::unique_ptr<Node> parse_statement(const std::string& keyword, int line) {
    auto n = std::make_unique<Node>();
    n->line = line;
    if (keyword == "if") return parse_if(std::move(n));
    if (keyword == "for") return parse_for(std::move(n));
    if (keyword == "set") return parse_set(std::move(n));
    if (keyword == "macro") return parse_macro(std::move(n));
    if (keyword == "break" || keyword == "continue") {
      n->kind = keyword == "break" ? Node::Kind::break_loop : Node::Kind::continue_loop;
      expect_end();
      return n;
    }
    if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else")
      fail(line, "unexpected {% " + keyword + " %}");
    if (keyword == "generation") {  // Hugging Face's marker of assistant text: renders its body
      n->kind = Node::Kind::block;
      expect_end();
      std::string stop;
      n->body = parse_body({"endgeneration"}, stop);
      expect_end();
      return n;
    }
    fail(line, "the tag '" + keyword + "' is not supported in chat templates here");
  }

  std::unique_ptr<Node> parse_if(std::unique_ptr<Node> n) {
    n->kind = Node::Kind::if_chain;
    ExprPtr condition = parse_tuple(false);
    while (true) {
      expect_end();
      std::string stop;
      Body body = parse_body({"endif", "elif", "else"}, stop);
      n->branches.emplace_back(std::move(condition), std::move(body));
      if (stop == "endif") break;
      if (stop == "else") {
        expect_end();
        Body else_body = parse_body({"endif"}, stop);
        n->branches.emplace_back(nullptr, std::move(else_body));
        break;
      }
      condition = parse_tuple(false);
    }
    expect_end();
    return n;
  }

  std::unique_ptr<Node> parse_for(std::unique_ptr<Node> n) {
    n->kind = Node::Kind::for_loop;
    n->targets = parse_targets();
    if (!take_name("in")) fail(n->line, "expected 'in' in a for loop");
    n->expr = parse_tuple(false, {"if", "recursive"});
    if (take_name("if")) n->condition = parse_expression(true);
    if (peek_name("recursive")) fail(n->line, "recursive loops are not supported");
    expect_end();
    std::string stop;
    n->body = parse_body({"endfor", "else"}, stop);
    if (stop == "else") {
      expect_end();
      n->else_body = parse_body({"endfor"}, stop);
    }
    expect_end();
    return n;
  }

  std::unique_ptr<Node> parse_set(std::unique_ptr<Node> n) {
    const int line = n->line;
    if (peek().kind != Token::Kind::name) fail(line, "expected a name after 'set'");
    if (at_ + 1 < tokens_.size() && tokens_[at_ + 1].text == ".") {  // set ns.attribute = value
      n->targets.push_back(take().text);
      take();
      if (peek().kind != Token::Kind::name) fail(line, "expected an attribute name after '.'");
      n->attribute = take().text;
    } else {
      n->targets = parse_targets();
    }
    if (take_op("=")) {
      n->kind = Node::Kind::set;
      n->expr = parse_tuple(true);
      expect_end();
      return n;
    }
    if (n->targets.size() != 1 || !n->attribute.empty()) fail(line, "a block set takes one name");
    n->kind = Node::Kind::set_block;
    expect_end();
    std::string stop;
    n->body = parse_body({"endset"}, stop);
    expect_end();
    return n;
  }

  std::unique_ptr<Node> parse_macro(std::unique_ptr<Node> n) {
    n->kind = Node::Kind::macro;
    if (peek().kind != Token::Kind::name) fail(n->line, "expected the macro's name");
    n->text = take().text;
    if (!take_op("(")) fail(n->line, "expected '(' after the macro's name");
    while (!take_op(")")) {
      if (!n->params.empty() && !take_op(",")) fail(n->line, "expected ',' between a macro's parameters");
      if (peek().kind != Token::Kind::name) fail(n->line, "expected a parameter name");
      std::string name = take().text;
      ExprPtr def = take_op("=") ? parse_expression(true) : nullptr;
      n->params.emplace_back(std::move(name), std::move(def));
    }
    expect_end();
    std::string stop;
    n->body = parse_body({"endmacro"}, stop);
    expect_end();
    return n;
  }

  // `name` or `a, b` or `(a, b)`
  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = take_op("(");
    do {
      if (peek().kind != Token::Kind::name) fail(peek().line, "expected a variable name");
      names.push_back(take().text);
    } while (take_op(","));
    if (paren && !take_op(")")) fail(peek().line, "expected ')'");
    return names;
  }

  // ---- expressions, in Jinja's precedence from loosest to tightest
  // a, b, c (a tuple) or one expression; `stop_names` end it (a for loop's `if`).
  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<std::string_view> stop_names = {}) {
    const int line = peek().line;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!take_op(",")) break;
        comma = true;
      }
      if (ends_tuple(stop_names)) break;
      items.push_back(parse_expression(with_condexpr));
    }
    if (!comma && items.size() == 1) return std::move(items[0]);
    if (items.empty()) fail(line, "expected an expression");
    auto t = make(Expr::Kind::tuple, line);
    t->operands = std::move(items);
    return t;
  }

  bool ends_tuple(std::initializer_list<std::string_view> stop_names) {
    const Token& t = peek();
    if (t.kind == Token::Kind::end) return true;
    if (t.kind == Token::Kind::op && (t.text == ")" || t.text == "]" || t.text == "}")) return true;
    if (t.kind == Token::Kind::name)
      for (std::string_view s : stop_names)
        if (t.text == s) return true;
    return false;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_conditional() : parse_or(); }

  ExprPtr parse_conditional() {
    ExprPtr e = parse_or();
    while (peek_name("if")) {
      const int line = take().line;
      auto c = make(Expr::Kind::conditional, line);
      ExprPtr condition = parse_or();
      ExprPtr otherwise = take_name("else") ? parse_conditional() : nullptr;
      c->operands.push_back(std::move(condition));
      c->operands.push_back(std::move(e));
      c->operands.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(kind, a->line);
    e->name = std::move(op);
    e->operands.push_back(std::move(a));
    e->operands.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (take_name("or")) e = binary(Expr::Kind::logical_or, "or", std::move(e), parse_and());
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (take_name("and")) e = binary(Expr::Kind::logical_and, "and", std::move(e), parse_not());
    return e;
  }

  ExprPtr parse_not() {
    if (peek_name("not")) {
      auto e = make(Expr::Kind::logical_not, take().line);
      e->operands.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr chain;
    while (true) {
      std::string op;
      const Token& t = peek();
      if (t.kind == Token::Kind::op &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = take().text;
      } else if (peek_name("in")) {
        take();
        op = "in";
      } else if (peek_name("not") && at_ + 1 < tokens_.size() && tokens_[at_ + 1].kind == Token::Kind::name &&
                 tokens_[at_ + 1].text == "in") {
        at_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!chain) {
        chain = make(Expr::Kind::compare, first->line);
        chain->operands.push_back(std::move(first));
      }
      chain->ops.push_back(op);
      chain->operands.push_back(parse_math1());
    }
    return chain ? std::move(chain) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (peek_op("+") || peek_op("-")) {
      std::string op = take().text;
      e = binary(Expr::Kind::binary, op, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (take_op("~")) e = binary(Expr::Kind::binary, "~", std::move(e), parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      std::string op = take().text;
      e = binary(Expr::Kind::binary, op, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (take_op("**")) e = binary(Expr::Kind::binary, "**", std::move(e), parse_unary(true));
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (peek_op("-") || peek_op("+")) {
      const Token t = take();
      e = make(t.text == "-" ? Expr::Kind::negate : Expr::Kind::positive, t.line);
      e->operands.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token t = take();
    switch (t.kind) {
      case Token::Kind::name: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = make(Expr::Kind::literal, t.line);
          e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = make(Expr::Kind::literal, t.line);
          e->value = Value::none();
          return e;
        }
        auto e = make(Expr::Kind::name, t.line);
        e->name = t.text;
        return e;
      }
      case Token::Kind::string: {
        std::string s = t.text;
        while (peek().kind == Token::Kind::string) s += take().text;  // adjacent literals join
        auto e = make(Expr::Kind::literal, t.line);
        e->value = Value::string(std::move(s));
        return e;
      }
      case Token::Kind::integer: {
        auto e = make(Expr::Kind::literal, t.line);
        errno = 0;
        const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) fail(t.line, "the integer " + t.text + " is too large");
        e->value = Value::integer(v);
        return e;
      }
      case Token::Kind::floating: {
        auto e = make(Expr::Kind::literal, t.line);
        e->value = Value::floating(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case Token::Kind::op:
        if (t.text == "(") {
          if (take_op(")")) return make(Expr::Kind::tuple, t.line);
          ExprPtr inner = parse_tuple(true);
          if (!take_op(")")) fail(t.line, "expected ')'");
          return inner;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::list, t.line);
          while (!take_op("]")) {
            if (!e->operands.empty() && !take_op(",")) fail(t.line, "expected ',' or ']' in a list");
            if (take_op("]")) break;
            e->operands.push_back(parse_expression(true));
          }
          return e;
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::dict, t.line);
          while (!take_op("}")) {
            if (!e->operands.empty() && !take_op(",")) fail(t.line, "expected ',' or '}' in a dict");
            if (take_op("}")) break;
            e->operands.push_back(parse_expression(true));
            if (!take_op(":")) fail(t.line, "expected ':' in a dict");
            e->operands.push_back(parse_expression(true));
          }
          return e;
        }
        break;
      case Token::Kind::end: fail(t.line, "unexpected end of an expression");
    }
    fail(t.line, "unexpected '" + t.text + "'");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (peek_op(".")) {
        const int line = take().line;
        const Token t = take();
        if (t.kind == Token::Kind::name) {
          e = make_applied(Expr::Kind::attribute, line, std::move(e), t.text);
        } else if (t.kind == Token::Kind::integer) {  // x.0 is x[0]
          auto index = make(Expr::Kind::literal, line);
          index->value = Value::integer(std::strtoll(t.text.c_str(), nullptr, 10));
          e = make_applied(Expr::Kind::subscript, line, std::move(e), "");
          e->operands.push_back(std::move(index));
        } else {
          fail(line, "expected an attribute name after '.'");
        }
      } else if (peek_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (peek_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::call, "");
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr subject) {
    const int line = take().line;  // '['
    ExprPtr parts[3];
    int colons = 0;
    while (!peek_op("]")) {
      if (take_op(":")) {
        if (++colons > 2) fail(line, "too many ':' in a slice");
        continue;
      }
      if (parts[colons]) fail(line, "expected ':' or ']'");
      parts[colons] = parse_expression(true);
    }
    take();
    if (colons == 0) {
      if (!parts[0]) fail(line, "an empty subscript");
      auto e = make_applied(Expr::Kind::subscript, line, std::move(subject), "");
      e->operands.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make_applied(Expr::Kind::slice, line, std::move(subject), "");
    for (auto& p : parts) e->operands.push_back(std::move(p));
    return e;
  }

  // ( positional..., name=value... ) after a callee, filter or test.
  ExprPtr parse_call(ExprPtr subject, Expr::Kind kind, std::string name) {
    const int line = take().line;  // '('
    auto e = make_applied(kind, line, std::move(subject), std::move(name));
    parse_arguments(*e, line);
    return e;
  }

  void parse_arguments(Expr& e, int line) {
    bool first = true;
    while (!take_op(")")) {
      if (!first && !take_op(",")) fail(line, "expected ',' or ')' in a call");
      first = false;
      if (take_op(")")) break;
      if (peek_op("*") || peek_op("**")) fail(line, "*args and **kwargs are not supported");
      if (peek().kind == Token::Kind::name && at_ + 1 < tokens_.size() && tokens_[at_ + 1].text == "=" &&
          tokens_[at_ + 1].kind == Token::Kind::op) {
        std::string key = take().text;
        take();
        e.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.keywords.empty()) fail(line, "a positional argument after a keyword argument");
        e.operands.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (peek_op("|")) {
        const int line = take().line;
        if (peek().kind != Token::Kind::name) fail(line, "expected a filter name after '|'");
        std::string name = take().text;
        if (peek_op("(")) {
          e = parse_call(std::move(e), Expr::Kind::filter, std::move(name));
        } else {
          e = make_applied(Expr::Kind::filter, line, std::move(e), std::move(name));
        }
      } else if (peek_name("is")) {
        e = parse_test(std::move(e));
      } else if (peek_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::call, "");
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr subject) {
    const int line = take().line;  // 'is'
    const bool negated = take_name("not");
    if (peek().kind != Token::Kind::name) fail(line, "expected a test name after 'is'");
    std::string name = take().text;
    ExprPtr t;
    if (peek_op("(")) {
      t = parse_call(std::move(subject), Expr::Kind::test, std::move(name));
    } else {
      t = make_applied(Expr::Kind::test, line, std::move(subject), std::move(name));
      const Token& n = peek();
      const bool argument = (n.kind == Token::Kind::name && n.text != "else" && n.text != "or" && n.text != "and") ||
                            n.kind == Token::Kind::string || n.kind == Token::Kind::integer ||
                            n.kind == Token::Kind::floating ||
                            (n.kind == Token::Kind::op && (n.text == "[" || n.text == "{"));
      if (argument) t->operands.push_back(parse_postfix(parse_primary()));
    }
    t->negated = negated;
    return t;
  }

  // ---- token helpers
  const Token& peek() const { return tokens_[at_]; }
  Token take() { return at_ + 1 < tokens_.size() ? tokens_[at_++] : tokens_[at_]; }
  bool peek_op(std::string_view op) const { return peek().kind == Token::Kind::op && peek().text == op; }
  bool peek_name(std::string_view n) const { return peek().kind == Token::Kind::name && peek().text == n; }
  bool take_op(std::string_view op) {
    if (!peek_op(op)) return false;
    ++at_;
    return true;
  }
  bool take_name(std::string_view n) {
    if (!peek_name(n)) return false;
    ++at_;
    return true;
  }
  void expect_end() {
    if (peek().kind != Token::Kind::end) fail(peek().line, "unexpected '" + peek().text + "' in a tag");
  }

  std::vector<Segment> segments_;
  size_t next_ = 0;
  std::vector<Token> tokens_;
  size_t at_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) { return Parser(scan(source)).parse_all(); }

}  // namespace fp4kv::model::jinja
