#include "fp4kv/serve/tool_calls.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "fp4kv/engine/scheduler.h"

namespace fp4kv::serve {

namespace {

using nlohmann::ordered_json;

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// One block's JSON as a call, or false when it is not {"name": string, "arguments": ...}.
bool parse_call(const std::string& body, ToolCall& call) {
  const ordered_json j = ordered_json::parse(trimmed(body), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  call.name = j["name"].get<std::string>();
  const auto args = j.find("arguments");
  if (args == j.end() || args->is_null())
    call.arguments = "{}";
  else if (args->is_string())
    call.arguments = args->get<std::string>();
  else
    call.arguments = args->dump(-1, ' ', /*ensure_ascii=*/false, ordered_json::error_handler_t::replace);
  return true;
}

}  // namespace

ParsedReply parse_tool_calls(const std::string& reply) {
  const size_t first = reply.find(kToolCallOpen);
  if (first == std::string::npos) return ParsedReply{reply, {}};
  ParsedReply out;
  out.content = reply.substr(0, first);
  size_t at = first;
  const size_t open = std::strlen(kToolCallOpen), close = std::strlen(kToolCallClose);
  while (at != std::string::npos) {
    const size_t body = at + open;
    const size_t end = reply.find(kToolCallClose, body);  // the last block may be unterminated
    ToolCall call;
    if (!parse_call(reply.substr(body, end == std::string::npos ? std::string::npos : end - body), call))
      return ParsedReply{reply, {}};
    out.calls.push_back(std::move(call));
    at = end == std::string::npos ? std::string::npos : reply.find(kToolCallOpen, end + close);
  }
  return out;
}

std::string ToolCallStream::feed(const std::string& piece) {
  held_ += piece;
  if (in_calls_) return "";
  const size_t open = held_.find(kToolCallOpen);
  if (open != std::string::npos) {
    in_calls_ = true;
    std::string ready = held_.substr(0, open);
    held_.erase(0, open);
    sent_ += ready;
    return ready;
  }
  const size_t keep = engine::partial_match_at_end(held_, {kToolCallOpen});
  std::string ready = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  sent_ += ready;
  return ready;
}

ParsedReply ToolCallStream::finish() {
  ParsedReply whole = parse_tool_calls(sent_ + held_);
  ParsedReply rest;
  rest.calls = std::move(whole.calls);
  // What the whole reply's content adds to what was sent (all of it, when the blocks failed
  // to parse and the reply is text after all).
  rest.content = whole.content.substr(std::min(sent_.size(), whole.content.size()));
  held_.clear();
  return rest;
}

}  // namespace fp4kv::serve
