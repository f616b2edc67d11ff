#include "fp4kv/serve/openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

namespace fp4kv::serve {

namespace {

using nlohmann::json;
// Request bodies keep their key order: a chat's messages and tools reach the template (and
// its tojson) as the client sent them.
using RequestJson = nlohmann::ordered_json;

// Stop strings per request at most (OpenAI allows 4; a few more cost nothing).
constexpr size_t kMaxStopStrings = 16;

std::string type_name(const RequestJson& v) { return v.type_name(); }

ApiError wrong_type(const std::string& field, const std::string& expected, const RequestJson& v) {
  return bad_request("'" + field + "' must be " + expected + ", got " + type_name(v) + " " + v.dump(),
                     "invalid_type");
}

// A present, non-null field, or nullptr.
const RequestJson* field(const RequestJson& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

long long integer_field(const RequestJson& v, const std::string& name) {
  if (!v.is_number_integer()) throw wrong_type(name, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) throw bad_request("'" + name + "' is too large");
  return v.get<long long>();
}

double number_field(const RequestJson& v, const std::string& name) {
  if (!v.is_number()) throw wrong_type(name, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw bad_request("'" + name + "' must be finite");
  return d;
}

bool bool_field(const RequestJson& v, const std::string& name) {
  if (!v.is_boolean()) throw wrong_type(name, "a boolean", v);
  return v.get<bool>();
}

// Field `name`: a list of token ids of the vocabulary.
std::vector<int> token_ids(const RequestJson& list, const std::string& name, const ModelLimits& limits) {
  if (!list.is_array()) throw wrong_type(name, "a list of token ids", list);
  std::vector<int> ids;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item = name + "[" + std::to_string(i) + "]";
    const long long id = integer_field(list[i], item);
    if (id < 0 || id >= limits.vocab_size)
      throw bad_request("'" + item + "' = " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(limits.vocab_size) + ")");
    ids.push_back(int(id));
  }
  return ids;
}

// `prompt`: one text, a list of texts, one list of token ids, or a list of such lists.
void parse_prompt(const RequestJson& body, const ModelLimits& limits, CompletionRequest& r) {
  const RequestJson* p = field(body, "prompt");
  if (!p) throw bad_request("'prompt' is required", "missing_field");
  auto text = [&r](const RequestJson& t) {
    if (t.get_ref<const std::string&>().empty()) throw bad_request("'prompt' holds an empty text");
    r.prompts.push_back(Prompt{{}, t.get<std::string>(), false});
  };
  if (p->is_string()) return text(*p);
  if (!p->is_array())
    throw wrong_type("prompt", "a string, a list of strings, a list of token ids or a list of such lists", *p);
  if (p->empty()) throw bad_request("'prompt' is an empty list");
  const RequestJson& first = (*p)[0];
  if (first.is_number()) {
    r.prompts.push_back(Prompt{token_ids(*p, "prompt", limits), {}, true});
    return;
  }
  if (p->size() > size_t(kMaxChoices))
    throw bad_request("'prompt' holds " + std::to_string(p->size()) + " prompts, at most " +
                      std::to_string(kMaxChoices));
  for (size_t i = 0; i < p->size(); ++i) {
    const RequestJson& item = (*p)[i];
    const std::string name = "prompt[" + std::to_string(i) + "]";
    if (item.is_string() && first.is_string()) {
      text(item);
    } else if (item.is_array() && first.is_array()) {
      if (item.empty()) throw bad_request("'" + name + "' is an empty list");
      r.prompts.push_back(Prompt{token_ids(item, name, limits), {}, true});
    } else {
      throw wrong_type(name, first.is_string() ? "a string (as prompt[0])" : "a list of token ids (as prompt[0])",
                       item);
    }
  }
}

void parse_stop(const RequestJson& body, CompletionRequest& r) {
  const RequestJson* s = field(body, "stop");
  if (!s) return;
  std::vector<std::string> stops;
  if (s->is_string()) {
    stops.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    for (const RequestJson& e : *s) {
      if (!e.is_string()) throw wrong_type("stop[]", "a string", e);
      stops.push_back(e.get<std::string>());
    }
  } else {
    throw wrong_type("stop", "a string or a list of strings", *s);
  }
  if (stops.size() > kMaxStopStrings)
    throw bad_request("'stop' has " + std::to_string(stops.size()) + " strings, at most " +
                      std::to_string(kMaxStopStrings));
  for (const std::string& t : stops)
    if (t.empty()) throw bad_request("'stop' holds an empty string");
  r.params.stop = std::move(stops);
}

std::string format_number(float x) {  // 0.6f as "0.6"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(x));
  return buf;
}

// vLLM's stop_token_ids: generation ends at any of these tokens, which is emitted.
void parse_stop_token_ids(const RequestJson& body, const ModelLimits& limits, CompletionRequest& r) {
  if (const RequestJson* ids = field(body, "stop_token_ids"))
    r.params.stop_token_ids = token_ids(*ids, "stop_token_ids", limits);
}

void parse_sampling(const RequestJson& body, const RequestDefaults& defaults, CompletionRequest& r) {
  SamplingRow& s = r.params.sampling;
  s.temperature = defaults.temperature;
  s.top_p = defaults.top_p;
  s.top_k = defaults.top_k;
  if (const RequestJson* v = field(body, "temperature")) {
    const double t = number_field(*v, "temperature");
    if (t < 0) throw bad_request("'temperature' must be >= 0, got " + v->dump());
    s.temperature = float(t);
  }
  if (const RequestJson* v = field(body, "top_p")) {
    const double p = number_field(*v, "top_p");
    if (!(p > 0 && p <= 1)) throw bad_request("'top_p' must be in (0, 1], got " + v->dump());
    s.top_p = float(p);
  }
  if (const RequestJson* v = field(body, "top_k")) {
    const long long k = integer_field(*v, "top_k");
    if (k < -1 || k > INT32_MAX) throw bad_request("'top_k' must be -1 (all), 0 (all) or positive, got " + v->dump());
    s.top_k = k < 0 ? 0 : int32_t(k);
  }
  if (const RequestJson* v = field(body, "seed")) {
    if (!v->is_number_integer()) throw wrong_type("seed", "an integer", *v);
    if (v->is_number_integer() && !v->is_number_unsigned() && v->get<long long>() < 0)
      throw bad_request("'seed' must be >= 0, got " + v->dump());
    s.seed = v->get<uint64_t>();
    s.request_id = kSeededRequestId;
    r.seeded = true;
  }
}

// Options of the OpenAI API this server does not implement: accepted only at their defaults,
// so a client never gets a silently different answer.
void refuse_unsupported(const RequestJson& body) {
  if (const RequestJson* v = field(body, "echo"); v && !(v->is_boolean() && !v->get<bool>()))
    throw bad_request("'echo' is not supported", "unsupported");
  if (const RequestJson* v = field(body, "suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
    throw bad_request("'suffix' is not supported", "unsupported");
  if (const RequestJson* v = field(body, "best_of"); v && !(v->is_number_integer() && v->get<long long>() == 1))
    throw bad_request("'best_of' must be 1, got " + v->dump(), "unsupported");
  for (const char* name : {"presence_penalty", "frequency_penalty"})
    if (const RequestJson* v = field(body, name); v && !(v->is_number() && v->get<double>() == 0.0))
      throw bad_request(std::string("'") + name + "' is not supported (must be 0), got " + v->dump(), "unsupported");
  if (const RequestJson* v = field(body, "logit_bias"); v && !(v->is_object() && v->empty()))
    throw bad_request("'logit_bias' is not supported", "unsupported");
}

}  // namespace

std::string RequestDefaults::describe() const {
  std::string text = "temperature " + format_number(temperature) + ", top_p " + format_number(top_p) + ", top_k " +
                     (top_k > 0 ? std::to_string(top_k) : std::string("all"));
  if (max_tokens) text += ", max_tokens " + std::to_string(*max_tokens);
  text += origin.empty() ? " (OpenAI's defaults)" : " (from " + origin + ")";
  for (const auto& [name, value] : not_applied) text += "; not applied: " + name + " " + format_number(value);
  return text;
}

json error_body(const std::string& message, const std::string& type, const std::string& code) {
  return json{{"error", {{"message", sanitize_utf8(message)}, {"type", type}, {"code", code}}}};
}

ApiError bad_request(const std::string& message, const std::string& code) {
  return ApiError(kHttpBadRequest, "invalid_request_error", code, message);
}

namespace {

RequestJson parse_body(const std::string& body_text) {
  RequestJson body = RequestJson::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw bad_request("the request body is not valid JSON", "invalid_json");
  if (!body.is_object()) throw bad_request("the request body must be a JSON object, got " + type_name(body), "invalid_json");
  return body;
}

void check_model(const RequestJson& body, const ModelLimits& limits) {
  if (const RequestJson* m = field(body, "model")) {
    if (!m->is_string()) throw wrong_type("model", "a string", *m);
    const std::string& name = m->get_ref<const std::string&>();
    if (name != limits.model_name &&
        std::find(limits.other_names.begin(), limits.other_names.end(), name) == limits.other_names.end())
      throw ApiError(kHttpNotFound, "invalid_request_error", "model_not_found",
                     "model '" + name + "' is not served here; this server serves '" + limits.model_name + "'");
  }
}

void parse_max_tokens(const RequestJson& v, const std::string& name, const ModelLimits& limits, CompletionRequest& r) {
  const long long n = integer_field(v, name);
  if (n < 1) throw bad_request("'" + name + "' must be >= 1, got " + v.dump());
  if (n >= limits.context)
    throw bad_request("'" + name + "' = " + v.dump() + " is beyond the model's context of " +
                      std::to_string(limits.context) + " tokens (prompt included)", "context_length_exceeded");
  r.params.max_tokens = int(n);
  r.max_tokens_given = true;
}

// The options completions and chat completions share: n, sampling, stop, streaming, EOS.
void parse_options(const RequestJson& body, const ModelLimits& limits, CompletionRequest& r) {
  if (const RequestJson* v = field(body, "n")) {
    const long long n = integer_field(*v, "n");
    if (n < 1 || n > kMaxChoices)
      throw bad_request("'n' must be 1.." + std::to_string(kMaxChoices) + ", got " + v->dump());
    r.n = int(n);
  }
  parse_sampling(body, limits.defaults, r);
  parse_stop(body, r);
  parse_stop_token_ids(body, limits, r);
  if (const RequestJson* v = field(body, "stream")) r.stream = bool_field(*v, "stream");
  if (const RequestJson* v = field(body, "stream_options")) {
    if (!v->is_object()) throw wrong_type("stream_options", "an object", *v);
    if (const RequestJson* u = field(*v, "include_usage"))
      r.include_usage = bool_field(*u, "stream_options.include_usage");
  }
  if (const RequestJson* v = field(body, "ignore_eos")) r.params.stop_at_eos = !bool_field(*v, "ignore_eos");
  if (const RequestJson* v = field(body, "user"); v && !v->is_string()) throw wrong_type("user", "a string", *v);
  refuse_unsupported(body);
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body_text, const ModelLimits& limits) {
  const RequestJson body = parse_body(body_text);
  check_model(body, limits);
  CompletionRequest r;
  parse_prompt(body, limits, r);
  r.params.max_tokens = kDefaultMaxTokens;
  if (const RequestJson* v = field(body, "max_tokens")) parse_max_tokens(*v, "max_tokens", limits, r);
  for (const Prompt& prompt : r.prompts) {
    const long long length = (long long)prompt.tokens.size() + r.params.max_tokens;
    if (prompt.is_tokens && r.max_tokens_given && length > limits.context)
      throw bad_request("prompt (" + std::to_string(prompt.tokens.size()) + " tokens) + max_tokens (" +
                        std::to_string(r.params.max_tokens) + ") exceeds the model's context of " +
                        std::to_string(limits.context) + " tokens", "context_length_exceeded");
  }
  if (const RequestJson* v = field(body, "logprobs")) {
    const long long n = integer_field(*v, "logprobs");
    if (n < 0 || n > engine::kMaxTopLogprobs)
      throw bad_request("'logprobs' must be 0.." + std::to_string(engine::kMaxTopLogprobs) +
                        " (alternatives per token), got " + v->dump());
    r.params.logprobs = int(n);
  }
  parse_options(body, limits, r);
  if (r.prompts.size() * size_t(r.n) > size_t(kMaxChoices))
    throw bad_request(std::to_string(r.prompts.size()) + " prompts x n = " + std::to_string(r.n) + " are more than " +
                      std::to_string(kMaxChoices) + " completions in one request");
  return r;
}

namespace {

constexpr const char* kChatRoles[] = {"system", "developer", "user", "assistant", "tool"};

// A message's content as the template sees it: a string (text parts joined with newlines, as
// vLLM joins them for templates that take a string), or null.
RequestJson message_content(const RequestJson& content, const std::string& where, bool may_be_null) {
  if (content.is_string()) return content;
  if (content.is_null()) {
    if (!may_be_null) throw bad_request("'" + where + ".content' is required");
    return content;
  }
  if (!content.is_array())
    throw bad_request("'" + where + ".content' must be a string or a list of text parts", "invalid_type");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const RequestJson& part = content[i];
    const std::string at = where + ".content[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      throw bad_request("'" + at + "' must be an object with a 'type'", "invalid_type");
    if (part["type"] != "text")
      throw bad_request("'" + at + "' is a '" + part["type"].get<std::string>() +
                        "' part; this server serves a text model (text parts only)", "unsupported");
    if (!part.contains("text") || !part["text"].is_string())
      throw bad_request("'" + at + ".text' must be a string", "invalid_type");
    text += (i ? "\n" : "") + part["text"].get<std::string>();
  }
  return text;
}

std::string parse_messages(const RequestJson& body) {
  const auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw bad_request("'messages' is required", "missing_field");
  if (!it->is_array() || it->empty())
    throw bad_request("'messages' must be a non-empty list of messages", "invalid_type");
  RequestJson messages = RequestJson::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const RequestJson& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request("'" + where + "' must be an object", "invalid_type");
    if (!m.contains("role") || !m["role"].is_string())
      throw bad_request("'" + where + ".role' must be a string", "invalid_type");
    const std::string role = m["role"].get<std::string>();
    if (std::find(std::begin(kChatRoles), std::end(kChatRoles), role) == std::end(kChatRoles))
      throw bad_request("'" + where + ".role' = '" + role + "' is not one of system, developer, user, assistant, tool");
    RequestJson message = m;
    message["content"] = message_content(m.contains("content") ? m["content"] : RequestJson(nullptr), where,
                                         role == "assistant");
    messages.push_back(std::move(message));
  }
  return messages.dump();
}

// tools: rendered into the prompt. tool_choice "auto" (the default with tools) parses the
// reply's calls, when the server parses them; "none" keeps the reply text.
std::string parse_tools(const RequestJson& body, bool tool_call_parsing, bool& parse_calls) {
  parse_calls = false;
  const auto tools = body.find("tools");
  const auto choice = body.find("tool_choice");
  const bool has_choice = choice != body.end() && !choice->is_null();
  if (has_choice && !(choice->is_string() && (*choice == "none" || *choice == "auto")))
    throw bad_request("'tool_choice' must be \"none\" or \"auto\" here (\"required\" and a named function need "
                      "constrained decoding, which this server does not do)", "unsupported");
  if (tools == body.end() || tools->is_null() || (tools->is_array() && tools->empty())) return "";
  if (!tools->is_array()) throw bad_request("'tools' must be a list", "invalid_type");
  if (!(has_choice && *choice == "none")) {
    if (!tool_call_parsing)
      throw bad_request("tool calls are not parsed from replies: start the server with --tool-call-parser hermes, "
                        "or send 'tool_choice': \"none\" to render the tools into the prompt and get the reply as "
                        "text", "unsupported");
    parse_calls = true;
  }
  return tools->dump();
}

void refuse_unsupported_chat(const RequestJson& body) {
  if (const RequestJson* v = field(body, "continue_final_message"); v && !(v->is_boolean() && !v->get<bool>()))
    throw bad_request("'continue_final_message' is not supported", "unsupported");
  if (field(body, "chat_template")) throw bad_request("a per-request 'chat_template' is not supported", "unsupported");
  if (const RequestJson* v = field(body, "parallel_tool_calls"); v && !v->is_boolean())
    throw wrong_type("parallel_tool_calls", "a boolean", *v);
  if (const RequestJson* v = field(body, "response_format"); v && !(v->is_object() && v->value("type", "") == "text"))
    throw bad_request("'response_format' other than {\"type\": \"text\"} is not supported", "unsupported");
}

void parse_chat_logprobs(const RequestJson& body, CompletionRequest& r) {
  const RequestJson* logprobs = field(body, "logprobs");
  const bool wanted = logprobs && bool_field(*logprobs, "logprobs");
  if (const RequestJson* v = field(body, "top_logprobs")) {
    const long long n = integer_field(*v, "top_logprobs");
    if (n < 0 || n > engine::kMaxTopLogprobs)
      throw bad_request("'top_logprobs' must be 0.." + std::to_string(engine::kMaxTopLogprobs) + ", got " + v->dump());
    if (!wanted) throw bad_request("'top_logprobs' needs 'logprobs': true");
    r.params.logprobs = int(n);
  } else if (wanted) {
    r.params.logprobs = 0;
  }
}

}  // namespace

namespace {

ChatRequest parse_chat_body(const RequestJson& body, const ModelLimits& limits, bool tool_call_parsing) {
  check_model(body, limits);
  ChatRequest r;
  r.options.chat = true;
  r.conversation.messages_json = parse_messages(body);
  r.conversation.tools_json = parse_tools(body, tool_call_parsing, r.options.parse_tool_calls);
  if (const auto kw = body.find("chat_template_kwargs"); kw != body.end() && !kw->is_null()) {
    if (!kw->is_object()) throw bad_request("'chat_template_kwargs' must be an object", "invalid_type");
    r.conversation.variables_json = kw->dump();
  }
  if (const RequestJson* v = field(body, "add_generation_prompt"))
    r.conversation.add_generation_prompt = bool_field(*v, "add_generation_prompt");
  const RequestJson* max_completion = field(body, "max_completion_tokens");
  const RequestJson* max_tokens = field(body, "max_tokens");
  if (max_completion && max_tokens && *max_completion != *max_tokens)
    throw bad_request("'max_completion_tokens' and 'max_tokens' differ; send one");
  if (max_completion) parse_max_tokens(*max_completion, "max_completion_tokens", limits, r.options);
  else if (max_tokens) parse_max_tokens(*max_tokens, "max_tokens", limits, r.options);
  parse_chat_logprobs(body, r.options);
  refuse_unsupported_chat(body);
  parse_options(body, limits, r.options);
  return r;
}

}  // namespace

ChatRequest parse_chat_request(const std::string& body_text, const ModelLimits& limits, bool tool_call_parsing) {
  return parse_chat_body(parse_body(body_text), limits, tool_call_parsing);
}

TokenizeRequest parse_tokenize_request(const std::string& body_text, const ModelLimits& limits) {
  const RequestJson body = parse_body(body_text);
  check_model(body, limits);
  const RequestJson* prompt = field(body, "prompt");
  const bool chat = field(body, "messages") != nullptr;
  if ((prompt != nullptr) == chat)
    throw bad_request("send either 'prompt' (text) or 'messages' (a chat)", "missing_field");
  TokenizeRequest r;
  r.chat = chat;
  if (const RequestJson* v = field(body, "add_special_tokens"))
    r.add_special_tokens = bool_field(*v, "add_special_tokens");
  if (chat) {
    r.conversation = parse_chat_body(body, limits, /*tool_call_parsing=*/true).conversation;
    return r;
  }
  if (!prompt->is_string()) throw wrong_type("prompt", "a string", *prompt);
  r.prompt = prompt->get<std::string>();
  if (r.prompt.empty()) throw bad_request("'prompt' is empty");
  return r;
}

std::vector<int> parse_detokenize_request(const std::string& body_text, const ModelLimits& limits) {
  const RequestJson body = parse_body(body_text);
  check_model(body, limits);
  const RequestJson* tokens = field(body, "tokens");
  if (!tokens) throw bad_request("'tokens' is required", "missing_field");
  return token_ids(*tokens, "tokens", limits);
}

json tokenize_json(const std::vector<int>& tokens, int max_model_len) {
  return json{{"count", tokens.size()}, {"max_model_len", max_model_len}, {"tokens", tokens}};
}

json detokenize_json(const std::string& text) { return json{{"prompt", sanitize_utf8(text)}}; }

const char* openai_finish_reason(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::eos:
    case engine::FinishReason::stop: return "stop";
    case engine::FinishReason::length: return "length";
    case engine::FinishReason::cancelled: return "cancelled";
    case engine::FinishReason::none: break;
  }
  return nullptr;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json logprobs_json(const std::vector<int>& tokens, const std::vector<engine::TokenLogprobs>& lp,
                   const engine::Detokenize& decode, size_t offset) {
  json out{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
           {"text_offset", json::array()}};
  for (size_t i = 0; i < tokens.size() && i < lp.size(); ++i) {
    const std::string piece = decode({tokens[i]});
    out["tokens"].push_back(sanitize_utf8(piece));
    out["token_logprobs"].push_back(lp[i].logprob);
    json top = json::object();
    for (const auto& [token, logprob] : lp[i].top) top[sanitize_utf8(decode({token}))] = logprob;
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += piece.size();
  }
  return out;
}

json completion_json(const std::string& id, const std::string& model, long long created, const std::string& text,
                     engine::FinishReason finish, const Usage& usage, const json& logprobs) {
  const char* reason = openai_finish_reason(finish);
  json choice{{"index", 0}, {"text", sanitize_utf8(text)}, {"logprobs", logprobs},
              {"finish_reason", reason ? json(reason) : json(nullptr)}};
  return json{{"id", id},           {"object", "text_completion"},   {"created", created},
              {"model", model},     {"choices", json::array({choice})}, {"usage", usage_json(usage)}};
}

json completion_chunk_json(const std::string& id, const std::string& model, long long created, const std::string& text,
                           engine::FinishReason finish, const std::optional<Usage>& usage, const json& logprobs,
                           int index) {
  json j{{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}};
  if (usage) {
    j["choices"] = json::array();
    j["usage"] = usage_json(*usage);
    return j;
  }
  const char* reason = openai_finish_reason(finish);
  json choice{{"index", index}, {"text", sanitize_utf8(text)}, {"logprobs", logprobs},
              {"finish_reason", reason ? json(reason) : json(nullptr)}};
  j["choices"] = json::array({choice});
  return j;
}

namespace {

// OpenAI's finish_reason of a chat reply: "tool_calls" for one that called tools and ended
// by itself.
json chat_finish_reason(engine::FinishReason finish, bool called_tools) {
  if (called_tools && (finish == engine::FinishReason::eos || finish == engine::FinishReason::stop))
    return "tool_calls";
  const char* reason = openai_finish_reason(finish);
  return reason ? json(reason) : json(nullptr);
}

json tool_call_json(const std::string& id, size_t index, const ToolCall& call) {
  return json{{"id", id + "_" + std::to_string(index)},
              {"type", "function"},
              {"function", {{"name", sanitize_utf8(call.name)}, {"arguments", sanitize_utf8(call.arguments)}}}};
}

}  // namespace

json chat_completion_json(const std::string& id, const std::string& model, long long created, const ParsedReply& reply,
                          engine::FinishReason finish, const Usage& usage, const json& logprobs,
                          const std::optional<std::string>& reasoning) {
  json message{{"role", "assistant"}};
  const bool has_content = !reply.content.empty() || (reply.calls.empty() && !reasoning);
  message["content"] = has_content ? json(sanitize_utf8(reply.content)) : json(nullptr);
  if (reasoning) message["reasoning_content"] = reasoning->empty() ? json(nullptr) : json(sanitize_utf8(*reasoning));
  if (!reply.calls.empty()) {
    message["tool_calls"] = json::array();
    for (size_t i = 0; i < reply.calls.size(); ++i)
      message["tool_calls"].push_back(tool_call_json(id, i, reply.calls[i]));
  }
  json choice{{"index", 0},
              {"message", message},
              {"logprobs", logprobs},
              {"finish_reason", chat_finish_reason(finish, !reply.calls.empty())}};
  return json{{"id", id},       {"object", "chat.completion"},    {"created", created},
              {"model", model}, {"choices", json::array({choice})}, {"usage", usage_json(usage)}};
}

json chat_chunk_json(const std::string& id, const std::string& model, long long created, const json& delta,
                     engine::FinishReason finish, const std::optional<Usage>& usage, const json& logprobs,
                     bool called_tools, int index) {
  json j{{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model}};
  if (usage) {
    j["choices"] = json::array();
    j["usage"] = usage_json(*usage);
    return j;
  }
  json choice{{"index", index}, {"delta", delta}, {"logprobs", logprobs},
              {"finish_reason", chat_finish_reason(finish, called_tools)}};
  j["choices"] = json::array({choice});
  return j;
}

json tool_call_delta(const std::string& id, size_t index, const ToolCall& call) {
  json c = tool_call_json(id, index, call);
  c["index"] = index;
  return json{{"tool_calls", json::array({c})}};
}

namespace {

// {token, logprob, bytes}: the token's text made valid UTF-8 and its raw bytes.
json chat_token_json(const std::string& piece, float logprob) {
  json bytes = json::array();
  for (unsigned char b : piece) bytes.push_back(int(b));
  return json{{"token", sanitize_utf8(piece)}, {"logprob", logprob}, {"bytes", bytes}};
}

}  // namespace

json chat_logprobs_json(const std::vector<int>& tokens, const std::vector<engine::TokenLogprobs>& lp,
                        const engine::Detokenize& decode) {
  json content = json::array();
  for (size_t i = 0; i < tokens.size() && i < lp.size(); ++i) {
    json entry = chat_token_json(decode({tokens[i]}), lp[i].logprob);
    json top = json::array();
    for (const auto& [token, logprob] : lp[i].top) top.push_back(chat_token_json(decode({token}), logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return json{{"content", content}};
}

std::string sse_event(const json& payload) { return "data: " + payload.dump() + "\n\n"; }

}  // namespace fp4kv::serve
