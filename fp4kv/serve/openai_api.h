// The OpenAI completions and chat completions APIs as plain data: a request body (JSON)
// checked and turned into the engine's RequestParams (and, for chat, the conversation the chat
// template renders), responses and server-sent-event chunks built from the engine's tokens,
// and the JSON error body. No HTTP here (server.h owns the sockets), so every rule a
// client can trip over is testable without a network.
//
// Invariants: parse_completion_request and parse_chat_request either return a request the
// engine can take or throw ApiError (status 400/404) naming the bad field; every string put into JSON is valid
// UTF-8 (byte-level tokens may split a character: utf8_complete_prefix holds the tail back
// while streaming, sanitize_utf8 replaces what is invalid), so dumping never throws.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fp4kv/engine/engine.h"
#include "fp4kv/model/chat_template.h"
#include "fp4kv/serve/tool_calls.h"
#include "fp4kv/model/unicode_text.h"

namespace fp4kv::serve {

// An error a client caused (or met): the HTTP status and OpenAI's error type and code.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string code, const std::string& message)
      : std::runtime_error(message), status_(status), type_(std::move(type)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string type_, code_;
};

inline constexpr int kHttpBadRequest = 400;
inline constexpr int kHttpUnauthorized = 401;
inline constexpr int kHttpNotFound = 404;
inline constexpr int kHttpPayloadTooLarge = 413;
inline constexpr int kHttpInternalError = 500;
inline constexpr int kHttpUnavailable = 503;

// The most completions (prompts x n) one request may ask for: each is an engine request.
inline constexpr int kMaxChoices = 64;

// OpenAI's default when max_tokens is absent.
inline constexpr int kDefaultMaxTokens = 16;
// Seeded draws use this fixed request id, so one seed gives one text whatever the engine's
// request id (generate_on_cpu with sampling.request_id = kSeededRequestId gives the same).
inline constexpr uint64_t kSeededRequestId = 1;

// {"error": {"message", "type", "code"}}
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& code);
ApiError bad_request(const std::string& message, const std::string& code = "invalid_request");

// One prompt of a completions request: token ids, or a text the server tokenizes.
struct Prompt {
  std::vector<int> tokens;
  std::string text;
  bool is_tokens = false;
};

struct CompletionRequest {
  std::vector<Prompt> prompts;     // completions: one or more; chat: none (the template renders one)
  engine::RequestParams params;
  bool max_tokens_given = false;   // else params.max_tokens is the endpoint's default
  bool seeded = false;             // the client gave a seed (else the server draws one)
  int n = 1;                       // choices: n engine requests of the same prompt
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage: a last chunk with usage
  bool chat = false;               // a chat completion: chat.completion objects and chunks
  bool parse_tool_calls = false;   // chat with tools, tool_choice "auto": calls parsed from the reply
};

// What a request gets for a sampling field it leaves out: OpenAI's defaults (temperature 1, no
// top-p or top-k cut; max_tokens the endpoint's) unless the checkpoint's generation_config.json
// recommends others, which apply as vLLM's --generation-config auto applies them.
struct RequestDefaults {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;                         // 0: all tokens
  std::optional<int> max_tokens;         // max_new_tokens (a request gets at most the rest of the context)
  std::string origin;                    // the file they come from; empty: OpenAI's
  std::vector<std::pair<std::string, float>> not_applied;  // recommended fields fp4kv does not implement
  // "temperature 0.6, top_p 0.95, top_k 20 (from <origin>); not applied: min_p 0.05", for the
  // start-up line.
  std::string describe() const;
};

// What the served model accepts, for the checks the engine cannot word for a client.
struct ModelLimits {
  std::string model_name;  // the id of GET /v1/models and of responses
  int vocab_size = 0;
  int context = 0;         // max positions (prompt + generated)
  // The checkpoint's chat template (model/chat_template.h); null: chat completions answer 400.
  std::shared_ptr<const model::ChatTemplate> chat_template;
  RequestDefaults defaults;
  std::vector<std::string> other_names;  // also answered to; a request naming any other model is 404
};

// Throws ApiError naming the field: malformed JSON, a known field of the wrong type or out of
// range, more than kMaxChoices completions (prompts x n), unsupported options set (echo,
// best_of, suffix, penalties), a prompt that is not a string, a list of strings, a list of
// token ids or a list of such lists, max_tokens beyond the context.
// Sampling fields left out take limits.defaults.
CompletionRequest parse_completion_request(const std::string& body, const ModelLimits& limits);

// A chat completion: the conversation the chat template renders into the prompt, and the
// options a completion has (prompt fields unset: the server fills them from the rendering).
struct ChatRequest {
  model::ChatInput conversation;
  CompletionRequest options;
};

// Chat completions' maximum tokens when the client sets none and the model's context is
// unbounded (with a bounded context the default is the rest of it, as vLLM's).
inline constexpr int kDefaultChatMaxTokensUnbounded = 4096;

// Throws ApiError naming the field. messages: a non-empty list of {role, content}, role one
// of system, developer, user, assistant, tool; content a string, a list of text parts
// (joined with newlines) or null (assistant only); other message fields (name, tool_calls,
// tool_call_id, reasoning_content) go to the template as sent. max_completion_tokens or
// max_tokens; logprobs (bool) with top_logprobs; chat_template_kwargs (template variables);
// add_generation_prompt. Tools render into the prompt; with tool_choice "auto" (the default
// with tools) the reply's Hermes-form calls become tool_calls, which needs
// `tool_call_parsing` (the server's --tool-call-parser hermes); "none" leaves the reply text;
// "required" and a named function are refused (they need constrained decoding). Refused:
// continue_final_message, a per-request chat_template, non-text content parts, and the
// completion options refused there.
ChatRequest parse_chat_request(const std::string& body, const ModelLimits& limits, bool tool_call_parsing = false);

// POST /tokenize and /detokenize (vLLM's): a prompt, or a chat conversation rendered by the
// chat template, into the token ids a completion would feed; ids back into text. Throws
// ApiError naming the field: neither or both of prompt and messages, a prompt that is not a
// non-empty string, chat fields as parse_chat_request checks them (tools are rendered whatever
// tool_choice), add_special_tokens not a boolean; for /detokenize, tokens not a list of ids in
// the vocabulary.
struct TokenizeRequest {
  bool chat = false;
  bool add_special_tokens = true;  // as completions feed prompts (false: the text's tokens alone)
  std::string prompt;              // the text to tokenize (not chat)
  model::ChatInput conversation;   // what the chat template renders (chat)
};
TokenizeRequest parse_tokenize_request(const std::string& body, const ModelLimits& limits);
std::vector<int> parse_detokenize_request(const std::string& body, const ModelLimits& limits);
// {"count", "max_model_len", "tokens"} and {"prompt"}.
nlohmann::json tokenize_json(const std::vector<int>& tokens, int max_model_len);
nlohmann::json detokenize_json(const std::string& text);

// OpenAI's finish_reason: eos and stop strings are "stop", max_tokens "length"; a request the
// server cancelled (shutdown) ends with "cancelled".
const char* openai_finish_reason(engine::FinishReason r);

// The UTF-8 safety of the responses (model/unicode_text.h).
using model::sanitize_utf8;
using model::utf8_complete_prefix;

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);

// OpenAI's completions `logprobs` object of `tokens`: tokens (each token's bytes alone, made
// valid UTF-8: a byte-level token may be part of a character), token_logprobs (the model's
// log-softmax: temperature 1, no top-k/top-p), top_logprobs ({token: logprob} of the most
// likely alternatives), text_offset (bytes of the completion before each token, from `offset`).
nlohmann::json logprobs_json(const std::vector<int>& tokens, const std::vector<engine::TokenLogprobs>& logprobs,
                             const engine::Detokenize& decode, size_t offset);

// A whole (non-streaming) text_completion object; `logprobs` null unless asked for.
nlohmann::json completion_json(const std::string& id, const std::string& model, long long created,
                               const std::string& text, engine::FinishReason finish, const Usage& usage,
                               const nlohmann::json& logprobs = nullptr);
// One streamed text_completion chunk; finish is none until the last; usage only on the usage
// chunk; `logprobs` covers the tokens the engine produced since the previous chunk (in a
// stream, a few bytes of their text may wait for the next chunk to complete a character).
nlohmann::json completion_chunk_json(const std::string& id, const std::string& model, long long created,
                                     const std::string& text, engine::FinishReason finish,
                                     const std::optional<Usage>& usage = std::nullopt,
                                     const nlohmann::json& logprobs = nullptr, int index = 0);
// The chat forms: a chat.completion object (message {role: assistant, content}); a
// chat.completion.chunk with `delta` ({"role": "assistant", "content": ""} first, then
// {"content": piece}, {} with the finish reason; no choices on the usage chunk); and chat
// logprobs ({"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}).
// With tool calls (tool_calls.h) the message's content is null when no text precedes them,
// each call is {id: <id>_<i>, type: function, function: {name, arguments}}, and a reply
// that ended by itself finishes with "tool_calls". With `reasoning` (a server with a reasoning
// parser, reasoning.h) the message has reasoning_content (null when empty) and an empty
// content is null; a streamed delta carries {"reasoning_content": piece}.
nlohmann::json chat_completion_json(const std::string& id, const std::string& model, long long created,
                                    const ParsedReply& reply, engine::FinishReason finish, const Usage& usage,
                                    const nlohmann::json& logprobs = nullptr,
                                    const std::optional<std::string>& reasoning = std::nullopt);
nlohmann::json chat_chunk_json(const std::string& id, const std::string& model, long long created,
                               const nlohmann::json& delta, engine::FinishReason finish,
                               const std::optional<Usage>& usage = std::nullopt,
                               const nlohmann::json& logprobs = nullptr, bool called_tools = false, int index = 0);
// A streamed call: {"tool_calls": [{index, id, type, function: {name, arguments}}]}.
nlohmann::json tool_call_delta(const std::string& id, size_t index, const ToolCall& call);
nlohmann::json chat_logprobs_json(const std::vector<int>& tokens, const std::vector<engine::TokenLogprobs>& logprobs,
                                  const engine::Detokenize& decode);
// `data: <json>\n\n`, and the terminator `data: [DONE]\n\n`.
std::string sse_event(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace fp4kv::serve
