// Tool calls in a model's reply, in the Hermes form that Qwen2.5, Qwen3 and Hermes chat
// templates ask for: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per
// call, after optional text. Parsed as vLLM's `hermes` tool parser parses them, into OpenAI's
// message.tool_calls; the text before the first block is the message's content.
//
// Invariants: a reply is either wholly text (no block, or any block that is not a JSON object
// with a string "name": then nothing is taken as a call) or text before the first block plus
// the calls; arguments are always a JSON text (an object given as an object is serialized,
// one given as a string is kept). ToolCallStream gives, over any cut of a reply into pieces,
// the same content and calls as parse_tool_calls of the whole.
#pragma once

#include <string>
#include <vector>

namespace fp4kv::serve {

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text
};

struct ParsedReply {
  std::string content;  // text outside the calls (empty: none)
  std::vector<ToolCall> calls;
};

inline constexpr const char* kToolCallOpen = "<tool_call>";
inline constexpr const char* kToolCallClose = "</tool_call>";

ParsedReply parse_tool_calls(const std::string& reply);

// A streamed reply: text is released as content while no block has begun (holding back a tail
// that may be the start of "<tool_call>"); from the first block on everything is held until
// finish(), which parses it.
class ToolCallStream {
 public:
  // Content that can be sent now.
  std::string feed(const std::string& piece);
  // The rest of the reply at its end: content not yet sent and the calls.
  ParsedReply finish();

 private:
  std::string sent_;  // content released so far
  std::string held_;  // not yet released
  bool in_calls_ = false;
};

}  // namespace fp4kv::serve
