// Reasoning in a model's reply, split from its answer: the text a thinking model writes
// between <think> and </think> (Qwen3, QwQ, DeepSeek-R1) goes to the chat message's
// `reasoning_content`, the rest to `content`, as vLLM's `qwen3` and `deepseek_r1` reasoning
// parsers and DeepSeek's API return it. The two forms (ReasoningSyntax) differ only in where
// a reply starts:
//   - qwen3: the model opens the block itself, so a reply that begins with <think> (after
//     optional whitespace, dropped) is reasoning up to </think>; any other reply is all
//     content (Qwen3's template renders enable_thinking=false as an empty block in the prompt);
//   - deepseek_r1: the template ends the prompt with <think>, so a reply starts inside the
//     reasoning (a leading <think> the model repeats is dropped) and it runs to </think>.
// Content is everything after </think>, verbatim; a reply that ends inside the reasoning (its
// token limit) has no content.
//
// Invariant: ReasoningStream over any cut of a reply into pieces gives, concatenated, the same
// reasoning and content as split_reasoning of the whole (split_reasoning is that stream fed
// once).
#pragma once

#include <optional>
#include <string>

namespace fp4kv::serve {

inline constexpr const char* kThinkOpen = "<think>";
inline constexpr const char* kThinkClose = "</think>";

struct ReasoningSyntax {
  const char* name;
  bool starts_inside;  // the prompt opened the block (the reply begins in the reasoning)
};
inline constexpr ReasoningSyntax kQwen3Reasoning{"qwen3", false};
inline constexpr ReasoningSyntax kDeepSeekR1Reasoning{"deepseek_r1", true};

// The syntax named `name` (a --reasoning-parser value), or nullopt.
std::optional<ReasoningSyntax> reasoning_syntax(const std::string& name);
// "qwen3, deepseek_r1", for messages.
std::string reasoning_syntax_names();

struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

ReasoningSplit split_reasoning(const std::string& reply, const ReasoningSyntax& syntax);

// A streamed reply: each piece's text released as reasoning or content as soon as it is known
// which (a tail that may begin a tag is held back, and so is a qwen3 reply's start until it is
// known whether it opens a block).
class ReasoningStream {
 public:
  explicit ReasoningStream(const ReasoningSyntax& syntax);
  ReasoningSplit feed(const std::string& piece);
  // What is held at the reply's end.
  ReasoningSplit finish();

 private:
  enum class Part { start, reasoning, content };
  ReasoningSyntax syntax_;
  Part part_;
  std::string held_;
};

}  // namespace fp4kv::serve
