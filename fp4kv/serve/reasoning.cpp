#include "fp4kv/serve/reasoning.h"

#include <cstring>

#include "fp4kv/engine/scheduler.h"

namespace fp4kv::serve {

namespace {

constexpr const char* kWhitespace = " \t\r\n";
constexpr ReasoningSyntax kSyntaxes[] = {kQwen3Reasoning, kDeepSeekR1Reasoning};

}  // namespace

std::optional<ReasoningSyntax> reasoning_syntax(const std::string& name) {
  for (const ReasoningSyntax& s : kSyntaxes)
    if (name == s.name) return s;
  return std::nullopt;
}

std::string reasoning_syntax_names() {
  std::string names;
  for (const ReasoningSyntax& s : kSyntaxes) names += (names.empty() ? "" : ", ") + std::string(s.name);
  return names;
}

ReasoningSplit split_reasoning(const std::string& reply, const ReasoningSyntax& syntax) {
  ReasoningStream stream(syntax);
  ReasoningSplit whole = stream.feed(reply);
  const ReasoningSplit rest = stream.finish();
  whole.reasoning += rest.reasoning;
  whole.content += rest.content;
  return whole;
}

ReasoningStream::ReasoningStream(const ReasoningSyntax& syntax) : syntax_(syntax), part_(Part::start) {}

ReasoningSplit ReasoningStream::feed(const std::string& piece) {
  held_ += piece;
  ReasoningSplit out;
  if (part_ == Part::start) {
    // Does the reply open with <think>? Undecided while what it holds (past whitespace) could
    // still grow into the tag.
    const size_t first = held_.find_first_not_of(kWhitespace);
    if (first == std::string::npos) return out;
    const std::string rest = held_.substr(first);
    const size_t open = std::strlen(kThinkOpen);
    if (rest.size() < open && std::strncmp(kThinkOpen, rest.c_str(), rest.size()) == 0) return out;
    if (rest.compare(0, open, kThinkOpen) == 0) {
      held_ = rest.substr(open);
      part_ = Part::reasoning;
    } else {
      part_ = syntax_.starts_inside ? Part::reasoning : Part::content;
    }
  }
  if (part_ == Part::reasoning) {
    const size_t close = held_.find(kThinkClose);
    if (close == std::string::npos) {
      const size_t keep = engine::partial_match_at_end(held_, {kThinkClose});
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
    out.reasoning = held_.substr(0, close);
    held_.erase(0, close + std::strlen(kThinkClose));
    part_ = Part::content;
  }
  out.content = held_;
  held_.clear();
  return out;
}

ReasoningSplit ReasoningStream::finish() {
  ReasoningSplit out;
  // A reply still undecided at its end is whitespace or a part of the tag: text of the part
  // the syntax starts in.
  const bool reasoning = part_ == Part::reasoning || (part_ == Part::start && syntax_.starts_inside);
  (reasoning ? out.reasoning : out.content) = held_;
  held_.clear();
  return out;
}

}  // namespace fp4kv::serve
