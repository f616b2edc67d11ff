// The completions and chat completions request rules, the response objects and the UTF-8
// handling, without a network.
#include "fp4kv/serve/openai_api.h"
#include "fp4kv/serve/serving.h"

#include <gtest/gtest.h>

namespace fp4kv::serve {
namespace {

ModelLimits limits() { return ModelLimits{"pk8l", 258, 64}; }

// The HTTP status a body gets from a parser: 200 when it parses, else its ApiError's.
template <class Parse>
int status_from(Parse parse, const std::string& body) {
  try {
    parse(body, limits());
  } catch (const ApiError& e) {
    return e.status();
  }
  return 200;
}

int status_of(const std::string& body) {
  return status_from([](const std::string& b, const ModelLimits& l) { parse_completion_request(b, l); }, body);
}
int chat_status(const std::string& body) {
  return status_from([](const std::string& b, const ModelLimits& l) { parse_chat_request(b, l); }, body);
}

// Sampling fields a request leaves out take the served model's defaults (OpenAI's: temperature
// 1, no cut; or its generation_config.json's); the request's own values win.
TEST(OpenAiApi, SamplingFieldsLeftOutTakeTheDefaults) {
  ModelLimits l = limits();
  const CompletionRequest openai = parse_completion_request(R"({"prompt":"Hi"})", l);
  EXPECT_FLOAT_EQ(openai.params.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(openai.params.sampling.top_p, 1.0f);
  EXPECT_EQ(openai.params.sampling.top_k, 0);
  l.defaults.temperature = 0.6f;
  l.defaults.top_p = 0.95f;
  l.defaults.top_k = 20;
  const ChatRequest chat = parse_chat_request(R"({"messages":[{"role":"user","content":"Hi"}],"top_p":0.5})", l);
  EXPECT_FLOAT_EQ(chat.options.params.sampling.temperature, 0.6f);
  EXPECT_FLOAT_EQ(chat.options.params.sampling.top_p, 0.5f);
  EXPECT_EQ(chat.options.params.sampling.top_k, 20);
  const CompletionRequest own = parse_completion_request(R"({"prompt":"Hi","temperature":0,"top_k":-1})", l);
  EXPECT_FLOAT_EQ(own.params.sampling.temperature, 0.0f);
  EXPECT_EQ(own.params.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(own.params.sampling.top_p, 0.95f);
  EXPECT_EQ(RequestDefaults{}.describe(), "temperature 1, top_p 1, top_k all (OpenAI's defaults)");
  l.defaults.max_tokens = 512;
  l.defaults.origin = "m/generation_config.json";
  l.defaults.not_applied = {{"repetition_penalty", 1.05f}, {"min_p", 0.05f}};
  EXPECT_EQ(l.defaults.describe(), "temperature 0.6, top_p 0.95, top_k 20, max_tokens 512 (from "
                                   "m/generation_config.json); not applied: repetition_penalty 1.05; not applied: "
                                   "min_p 0.05");
}

TEST(OpenAiApi, RequestDefaultsFromAGenerationConfig) {
  model::GenerationConfig g;
  g.path = "m/generation_config.json";
  EXPECT_TRUE(request_defaults(g).origin.empty());  // no sampling field: OpenAI's
  g.eos_token_ids = {7};
  g.repetition_penalty = 1.0f;
  g.min_p = 0.0f;
  EXPECT_TRUE(request_defaults(g).not_applied.empty());  // the neutral values are no loss
  g.top_k = -1;
  g.max_new_tokens = 100;
  g.repetition_penalty = 1.1f;
  const RequestDefaults d = request_defaults(g);
  EXPECT_EQ(d.origin, "m/generation_config.json");
  EXPECT_EQ(d.top_k, 0);
  EXPECT_FLOAT_EQ(d.temperature, 1.0f);
  EXPECT_EQ(d.max_tokens, 100);
  ASSERT_EQ(d.not_applied.size(), 1u);
  EXPECT_EQ(d.not_applied[0].first, "repetition_penalty");
}

TEST(OpenAiApi, TokenizeAndDetokenizeRequests) {
  const TokenizeRequest text = parse_tokenize_request(R"({"model":"pk8l","prompt":"Hi","add_special_tokens":false})",
                                                      limits());
  EXPECT_FALSE(text.chat);
  EXPECT_EQ(text.prompt, "Hi");
  EXPECT_FALSE(text.add_special_tokens);
  const TokenizeRequest chat = parse_tokenize_request(
      R"({"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false,
          "tools":[{"type":"function","function":{"name":"f"}}]})",
      limits());
  EXPECT_TRUE(chat.chat);
  EXPECT_TRUE(chat.add_special_tokens);
  EXPECT_FALSE(chat.conversation.add_generation_prompt);
  EXPECT_NE(chat.conversation.tools_json.find("\"f\""), std::string::npos);
  auto tokenize_status = [](const std::string& body) {
    return status_from([](const std::string& b, const ModelLimits& l) { parse_tokenize_request(b, l); }, body);
  };
  EXPECT_EQ(tokenize_status(R"({})"), 400);
  EXPECT_EQ(tokenize_status(R"({"prompt":"a","messages":[{"role":"user","content":"a"}]})"), 400);
  EXPECT_EQ(tokenize_status(R"({"prompt":""})"), 400);
  EXPECT_EQ(tokenize_status(R"({"prompt":[1,2]})"), 400);
  EXPECT_EQ(tokenize_status(R"({"prompt":"a","add_special_tokens":"yes"})"), 400);
  EXPECT_EQ(tokenize_status(R"({"prompt":"a","model":"other"})"), 404);
  EXPECT_EQ(tokenize_status(R"({"messages":[{"role":"robot","content":"a"}]})"), 400);
  EXPECT_EQ(parse_detokenize_request(R"({"tokens":[104,105]})", limits()), (std::vector<int>{104, 105}));
  EXPECT_TRUE(parse_detokenize_request(R"({"tokens":[]})", limits()).empty());
  auto detokenize_status = [](const std::string& body) {
    return status_from([](const std::string& b, const ModelLimits& l) { parse_detokenize_request(b, l); }, body);
  };
  EXPECT_EQ(detokenize_status(R"({})"), 400);
  EXPECT_EQ(detokenize_status(R"({"tokens":"hi"})"), 400);
  EXPECT_EQ(detokenize_status(R"({"tokens":[258]})"), 400);
  EXPECT_EQ(detokenize_status(R"({"tokens":[-1]})"), 400);
  EXPECT_EQ(detokenize_status(R"({"tokens":[1.5]})"), 400);
  EXPECT_EQ(tokenize_json({5, 6}, 64), (nlohmann::json{{"count", 2}, {"max_model_len", 64}, {"tokens", {5, 6}}}));
  EXPECT_EQ(detokenize_json("\xff"), (nlohmann::json{{"prompt", "\xef\xbf\xbd"}}));  // made valid UTF-8
}

TEST(OpenAiApi, ParsesAValidRequest) {
  const CompletionRequest r = parse_completion_request(
      R"({"model":"pk8l","prompt":"Hi","max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":3,"seed":7,"stop":["x","y"],"stream":true})",
      limits());
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Hi");
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 0.5f);
  EXPECT_EQ(r.params.sampling.top_k, 3);
  EXPECT_EQ(r.params.sampling.seed, 7u);
  EXPECT_EQ(r.params.sampling.request_id, kSeededRequestId);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x", "y"}));
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(parse_completion_request(R"({"prompt":"Hi","stop_token_ids":[10,257]})", limits()).params.stop_token_ids,
            (std::vector<int>{10, 257}));
  EXPECT_EQ(parse_completion_request(R"({"prompt":"Hi","n":64})", limits()).n, kMaxChoices);
  const CompletionRequest t = parse_completion_request(R"({"prompt":[1,2,3]})", limits());
  ASSERT_EQ(t.prompts.size(), 1u);
  EXPECT_TRUE(t.prompts[0].is_tokens);
  EXPECT_EQ(t.prompts[0].tokens, (std::vector<int>{1, 2, 3}));
  // Several prompts: texts, or token-id lists.
  const CompletionRequest texts = parse_completion_request(R"({"prompt":["a","bc"],"n":2})", limits());
  ASSERT_EQ(texts.prompts.size(), 2u);
  EXPECT_EQ(texts.prompts[1].text, "bc");
  const CompletionRequest lists = parse_completion_request(R"({"prompt":[[1],[2,3]]})", limits());
  ASSERT_EQ(lists.prompts.size(), 2u);
  EXPECT_EQ(lists.prompts[1].tokens, (std::vector<int>{2, 3}));
  EXPECT_EQ(t.params.max_tokens, kDefaultMaxTokens);
  EXPECT_EQ(t.params.logprobs, -1);  // none unless asked for
  EXPECT_EQ(parse_completion_request(R"({"prompt":"a","logprobs":0})", limits()).params.logprobs, 0);
  EXPECT_EQ(parse_completion_request(R"({"prompt":"a","logprobs":5})", limits()).params.logprobs, 5);
  EXPECT_EQ(parse_completion_request(R"({"prompt":"a","logprobs":null})", limits()).params.logprobs, -1);
}

// The logprobs object: one entry per token, offsets counting the token bytes before each.
TEST(OpenAiApi, LogprobsObjectFollowsTheTokens) {
  const engine::Detokenize decode = [](const std::vector<int>& t) {
    std::string s;
    for (int x : t) s += std::string(size_t(x % 3 + 1), char('a' + x % 26));
    return s;
  };
  std::vector<engine::TokenLogprobs> lp(2);
  lp[0].logprob = -0.5f;
  lp[0].top = {{4, -0.5f}, {7, -1.5f}};
  lp[1].logprob = -2.0f;
  const nlohmann::json j = logprobs_json({4, 5}, lp, decode, 10);
  EXPECT_EQ(j["tokens"], nlohmann::json({"ee", "fff"}));
  EXPECT_EQ(j["token_logprobs"], nlohmann::json({-0.5, -2.0}));
  EXPECT_EQ(j["text_offset"], nlohmann::json({10, 12}));
  EXPECT_EQ(j["top_logprobs"][0], nlohmann::json({{"ee", -0.5}, {"hh", -1.5}}));
  EXPECT_TRUE(j["top_logprobs"][1].empty());
}

TEST(OpenAiApi, RefusesBadRequests) {
  EXPECT_EQ(status_of("{"), 400);
  EXPECT_EQ(status_of("[1]"), 400);
  EXPECT_EQ(status_of(R"({})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":5})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":""})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[1,"a"]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[1,999]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[[1],"a"]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":["a",[1]]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":["a",""]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[[1],[]]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[[1],[999]]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":["a","b"],"n":33})"), 400);  // 66 completions
  EXPECT_EQ(status_of(R"({"prompt":[[1],[2,3,4]],"max_tokens":62})"), 400);  // the second does not fit
  EXPECT_EQ(status_of(R"({"prompt":"a","max_tokens":"5"})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","max_tokens":0})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","max_tokens":64})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[1,2,3],"max_tokens":62})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","stop_token_ids":[258]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","stop_token_ids":7})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","stop_token_ids":["x"]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","n":0})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","n":65})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","n":2.5})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","temperature":-1})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","top_p":0})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","seed":-3})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","stop":7})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","stop":[""]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","stream":"yes"})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","logprobs":6})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","logprobs":-1})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","logprobs":"3"})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","logprobs":true})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","model":"other"})"), 404);
  EXPECT_EQ(status_of(R"({"prompt":"a","unknown_field":{"x":1}})"), 200);  // unknown fields are ignored
  ModelLimits named = limits();
  named.other_names = {"other", "Qwen/Qwen3-4B"};
  EXPECT_NO_THROW(parse_completion_request(R"({"prompt":"a","model":"Qwen/Qwen3-4B"})", named));
  EXPECT_NO_THROW(parse_completion_request(R"({"prompt":"a","model":"pk8l"})", named));
  EXPECT_THROW(parse_completion_request(R"({"prompt":"a","model":"qwen3"})", named), ApiError);
}

// A chat request: the conversation as the template will see it (text parts joined, other
// message fields and key order kept), the shared options, the chat-only options.
TEST(OpenAiApi, ParsesAChatRequest) {
  const ChatRequest r = parse_chat_request(
      R"({"model":"pk8l","messages":[{"role":"system","content":"S"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
          {"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},
          {"role":"tool","content":"r","tool_call_id":"1"}],
          "max_completion_tokens":7,"temperature":0,"stop":"x","stream":true,"logprobs":true,"top_logprobs":2,
          "chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false,
          "tools":[{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}],"tool_choice":"none"})",
      limits());
  EXPECT_TRUE(r.options.chat);
  EXPECT_EQ(r.conversation.messages_json,
            R"([{"role":"system","content":"S"},{"role":"user","content":"a\nb"},)"
            R"({"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},)"
            R"({"role":"tool","content":"r","tool_call_id":"1"}])");
  EXPECT_EQ(r.conversation.tools_json, R"([{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}])");
  EXPECT_EQ(r.conversation.variables_json, R"({"enable_thinking":false})");
  EXPECT_FALSE(r.conversation.add_generation_prompt);
  EXPECT_EQ(r.options.params.max_tokens, 7);
  EXPECT_TRUE(r.options.max_tokens_given);
  EXPECT_EQ(r.options.params.logprobs, 2);
  EXPECT_EQ(r.options.params.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.options.stream);
  const ChatRequest plain = parse_chat_request(R"({"messages":[{"role":"user","content":"hi"}]})", limits());
  EXPECT_FALSE(plain.options.max_tokens_given);
  EXPECT_TRUE(plain.conversation.add_generation_prompt);
  EXPECT_EQ(plain.options.params.logprobs, -1);
  EXPECT_TRUE(plain.conversation.tools_json.empty());
  EXPECT_EQ(parse_chat_request(R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true})", limits())
                .options.params.logprobs,
            0);
}

TEST(OpenAiApi, RefusesBadChatRequests) {
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_EQ(chat_status("{" + user + "}"), 200);
  EXPECT_EQ(chat_status(R"({})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[]})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":"hi"})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[{"content":"hi"}]})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[{"role":"wizard","content":"hi"}]})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[{"role":"user"}]})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[{"role":"user","content":null}]})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[{"role":"user","content":5}]})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})"), 400);
  EXPECT_EQ(chat_status(R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"max_tokens":2,"max_completion_tokens":3})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"max_completion_tokens":64})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"top_logprobs":2})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"logprobs":3})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"n":-1})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"continue_final_message":true})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"chat_template":"{{ x }}"})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"chat_template_kwargs":[1]})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"tools":[{"type":"function"}]})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"tools":[{"type":"function"}],"tool_choice":"auto"})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"tools":[{"type":"function"}],"tool_choice":"none"})"), 200);
  EXPECT_EQ(chat_status("{" + user + R"(,"response_format":{"type":"json_object"}})"), 400);
  EXPECT_EQ(chat_status("{" + user + R"(,"model":"other"})"), 404);
}

TEST(OpenAiApi, ChatObjectsHaveOpenAisShape) {
  const nlohmann::json whole =
      chat_completion_json("chatcmpl-1", "m", 5, ParsedReply{"hi", {}}, engine::FinishReason::eos, Usage{3, 1});
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"], nlohmann::json({{"role", "assistant"}, {"content", "hi"}}));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(whole["usage"]["total_tokens"], 4);
  const nlohmann::json chunk =
      chat_chunk_json("chatcmpl-1", "m", 5, {{"content", "h"}}, engine::FinishReason::none);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "h");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  const engine::Detokenize decode = [](const std::vector<int>& t) { return std::string(size_t(t[0]), 'x'); };
  std::vector<engine::TokenLogprobs> lp(1);
  lp[0].logprob = -0.25f;
  lp[0].top = {{2, -0.25f}};
  const nlohmann::json j = chat_logprobs_json({2}, lp, decode);
  EXPECT_EQ(j["content"][0]["token"], "xx");
  EXPECT_EQ(j["content"][0]["bytes"], nlohmann::json({120, 120}));
  EXPECT_EQ(j["content"][0]["top_logprobs"][0]["logprob"], -0.25);

  const ParsedReply called{"", {{"get_weather", R"({"city": "Paris"})"}, {"f", "{}"}}};
  const nlohmann::json tools =
      chat_completion_json("chatcmpl-2", "m", 5, called, engine::FinishReason::eos, Usage{3, 9});
  const nlohmann::json& message = tools["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][0], nlohmann::json({{"id", "chatcmpl-2_0"},
                                                       {"type", "function"},
                                                       {"function", {{"name", "get_weather"},
                                                                     {"arguments", R"({"city": "Paris"})"}}}}));
  EXPECT_EQ(tools["choices"][0]["finish_reason"], "tool_calls");
  const nlohmann::json cut = chat_completion_json("c", "m", 5, called, engine::FinishReason::length, Usage{});
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
  const nlohmann::json delta = tool_call_delta("c", 1, called.calls[1]);
  EXPECT_EQ(delta["tool_calls"][0]["index"], 1);
  EXPECT_EQ(delta["tool_calls"][0]["function"]["name"], "f");
}

// Tools need a tool_choice the server can honour: "none" always, "auto" (the default with
// tools) when it parses tool calls.
TEST(OpenAiApi, ToolChoiceFollowsTheServersParser) {
  const std::string tools =
      R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}])";
  auto parses = [&](const std::string& tail, bool parser) {
    return parse_chat_request(tools + tail, limits(), parser).options.parse_tool_calls;
  };
  EXPECT_TRUE(parses("}", true));
  EXPECT_TRUE(parses(R"(,"tool_choice":"auto"})", true));
  EXPECT_FALSE(parses(R"(,"tool_choice":"none"})", true));
  EXPECT_FALSE(parses(R"(,"tool_choice":"none"})", false));
  EXPECT_THROW(parses("}", false), ApiError);
  EXPECT_THROW(parses(R"(,"tool_choice":"required"})", true), ApiError);
  EXPECT_THROW(parses(R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})", true), ApiError);
  EXPECT_FALSE(parse_chat_request(R"({"messages":[{"role":"user","content":"hi"}]})", limits(), true)
                   .options.parse_tool_calls);
}

TEST(OpenAiApi, Utf8HoldsBackIncompleteAndReplacesInvalid) {
  const std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(utf8_complete_prefix("ab" + euro.substr(0, 2)), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab" + euro), 5u);
  EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(sanitize_utf8("a" + euro.substr(0, 2)), "a\xEF\xBF\xBD\xEF\xBF\xBD");
  const std::string mixed = "x" + euro + "\xC3(\xF0\x9F\x98\x80" + "\xE2\x82";
  for (size_t cut = 0; cut <= mixed.size(); ++cut) {  // streaming pieces concatenate to the whole
    std::string held = mixed.substr(0, cut), out;
    const size_t ready = utf8_complete_prefix(held);
    out += sanitize_utf8(held.substr(0, ready));
    out += sanitize_utf8(held.substr(ready) + mixed.substr(cut));
    EXPECT_EQ(out, sanitize_utf8(mixed)) << "cut " << cut;
  }
}

}  // namespace
}  // namespace fp4kv::serve
