// The reasoning parsers (serve/reasoning.h): both syntaxes' splits of whole replies, the
// stream's invariance to how a reply is cut, and the real server on loopback over a scripted
// backend (a model whose reply is known byte for byte), whole and streamed, with tool calls.
#include <httplib.h>

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fp4kv/core/error.h"
#include "fp4kv/engine/backend.h"
#include "fp4kv/serve/openai_api.h"
#include "fp4kv/serve/reasoning.h"
#include "fp4kv/serve/server.h"

namespace fp4kv::serve {
namespace {

using nlohmann::json;

void expect_split(const std::string& reply, const ReasoningSyntax& syntax, const std::string& reasoning,
                  const std::string& content) {
  SCOPED_TRACE(std::string(syntax.name) + ": '" + reply + "'");
  const ReasoningSplit s = split_reasoning(reply, syntax);
  EXPECT_EQ(s.reasoning, reasoning);
  EXPECT_EQ(s.content, content);
}

TEST(Reasoning, Qwen3RepliesThatOpenABlock) {
  const ReasoningSyntax q = kQwen3Reasoning;
  expect_split("<think>\nweigh it\n</think>\n\nIt is 42.", q, "\nweigh it\n", "\n\nIt is 42.");
  expect_split(" \n<think>a</think>b", q, "a", "b");
  expect_split("<think>a</think>b</think>c", q, "a", "b</think>c");  // one block: later tags are text
  expect_split("<think>cut at the limit", q, "cut at the limit", "");
  expect_split("<think></think>", q, "", "");
  expect_split("It is 42.", q, "", "It is 42.");  // thinking off: no block
  expect_split("x<think>a</think>b", q, "", "x<think>a</think>b");
  expect_split("<thin", q, "", "<thin");
  expect_split("  ", q, "", "  ");
  expect_split("", q, "", "");
}

TEST(Reasoning, DeepSeekR1RepliesStartInsideTheBlock) {
  const ReasoningSyntax r = kDeepSeekR1Reasoning;
  expect_split("weigh it\n</think>\n\nIt is 42.", r, "weigh it\n", "\n\nIt is 42.");
  expect_split("<think>\na</think>b", r, "\na", "b");  // a repeated opening tag is dropped
  expect_split("no end", r, "no end", "");
  expect_split("</think>b", r, "", "b");
  expect_split("a<think>b</think>c", r, "a<think>b", "c");
  expect_split("<thin", r, "<thin", "");
  expect_split("", r, "", "");
}

// Every cut of a reply into two or three pieces, and byte by byte, streams the whole split.
TEST(Reasoning, TheStreamDoesNotDependOnTheCuts) {
  const std::vector<std::string> replies = {
      "<think>\nweigh it\n</think>\n\nIt is 42.", " <think>a</think>b</think>", "It is <think>", "<thin",
      "a</thi</think>b", "\n\n<think>x</think", "<think>a</think></think>"};
  for (const ReasoningSyntax& syntax : {kQwen3Reasoning, kDeepSeekR1Reasoning}) {
    for (const std::string& reply : replies) {
      SCOPED_TRACE(std::string(syntax.name) + ": '" + reply + "'");
      const ReasoningSplit whole = split_reasoning(reply, syntax);
      auto streamed = [&](const std::vector<std::string>& pieces) {
        ReasoningStream s(syntax);
        ReasoningSplit got;
        for (const std::string& p : pieces) {
          const ReasoningSplit out = s.feed(p);
          got.reasoning += out.reasoning;
          got.content += out.content;
        }
        const ReasoningSplit rest = s.finish();
        EXPECT_EQ(got.reasoning + rest.reasoning, whole.reasoning);
        EXPECT_EQ(got.content + rest.content, whole.content);
      };
      std::vector<std::string> bytes;
      for (char ch : reply) bytes.emplace_back(1, ch);
      streamed(bytes);
      for (size_t i = 0; i <= reply.size(); ++i)
        for (size_t j = i; j <= reply.size(); ++j)
          streamed({reply.substr(0, i), reply.substr(i, j - i), reply.substr(j)});
    }
  }
}

// Reasoning is released as it comes, not held to the end.
TEST(Reasoning, TheStreamReleasesReasoningEarly) {
  ReasoningStream s(kQwen3Reasoning);
  EXPECT_EQ(s.feed("<thi").reasoning, "");
  EXPECT_EQ(s.feed("nk>weigh").reasoning, "weigh");
  EXPECT_EQ(s.feed(" it</th").reasoning, " it");
  const ReasoningSplit tail = s.feed("ink>42");
  EXPECT_EQ(tail.reasoning, "");
  EXPECT_EQ(tail.content, "42");
}

TEST(Reasoning, ParsersByName) {
  EXPECT_STREQ(reasoning_syntax("qwen3")->name, "qwen3");
  EXPECT_TRUE(reasoning_syntax("deepseek_r1")->starts_inside);
  EXPECT_FALSE(reasoning_syntax("qwen3")->starts_inside);
  EXPECT_FALSE(reasoning_syntax("hermes").has_value());
  EXPECT_FALSE(reasoning_syntax("").has_value());
  EXPECT_EQ(reasoning_syntax_names(), "qwen3, deepseek_r1");
}

TEST(Reasoning, ChatCompletionObject) {
  const Usage usage{3, 4};
  const json plain = chat_completion_json("c", "m", 1, ParsedReply{"hi", {}}, engine::FinishReason::eos, usage);
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));
  const json both = chat_completion_json("c", "m", 1, ParsedReply{"hi", {}}, engine::FinishReason::eos, usage,
                                         nullptr, std::string("why"));
  EXPECT_EQ(both["choices"][0]["message"]["reasoning_content"], "why");
  EXPECT_EQ(both["choices"][0]["message"]["content"], "hi");
  const json only = chat_completion_json("c", "m", 1, ParsedReply{"", {}}, engine::FinishReason::length, usage,
                                         nullptr, std::string("why"));
  EXPECT_TRUE(only["choices"][0]["message"]["content"].is_null());
  const json none = chat_completion_json("c", "m", 1, ParsedReply{"hi", {}}, engine::FinishReason::eos, usage,
                                         nullptr, std::string());
  EXPECT_TRUE(none["choices"][0]["message"]["reasoning_content"].is_null());
}

// ---- the server over a scripted backend ----

constexpr int kScriptVocab = 257;  // bytes, then EOS
constexpr int kScriptEos = 256;
constexpr float kScriptLogit = 20.0f;  // the scripted byte's logit (every other is 0)

// Every request's greedy reply is `script`, then EOS: a request's next token is the script's
// byte at the count of its decode calls so far.
class ScriptedBackend : public engine::Backend {
 public:
  explicit ScriptedBackend(std::string script) : script_(std::move(script)) {}
  int vocab_size() const override { return kScriptVocab; }
  bool is_eos(int token) const override { return token == kScriptEos; }
  int max_positions() const override { return 0; }
  std::vector<float> prefill(uint64_t request, const std::vector<int>&) override {
    return logits_at(decoded_[request]);
  }
  std::vector<float> decode(const std::vector<uint64_t>& requests, const std::vector<int>&) override {
    std::vector<float> out;
    for (uint64_t r : requests) {
      const std::vector<float> l = logits_at(++decoded_[r]);
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  }
  void drop(uint64_t request) override { decoded_.erase(request); }

 private:
  std::vector<float> logits_at(size_t i) const {
    std::vector<float> l(kScriptVocab, 0.0f);
    l[i < script_.size() ? size_t(static_cast<unsigned char>(script_[i])) : size_t(kScriptEos)] = kScriptLogit;
    return l;
  }
  std::string script_;
  std::map<uint64_t, size_t> decoded_;
};

engine::TextCodec byte_codec() {
  engine::TextCodec c;
  c.encode = [](std::string_view t) {
    std::vector<int> ids;
    for (char ch : t) ids.push_back(static_cast<unsigned char>(ch));
    return ids;
  };
  c.decode = [](const std::vector<int>& ids) {
    std::string text;
    for (int id : ids)
      if (id < kScriptEos) text += char(id);
    return text;
  };
  return c;
}

class ScriptedServer {
 public:
  ScriptedServer(const std::string& script, const std::string& reasoning_parser,
                 const std::string& tool_call_parser = "") {
    engine::SchedulerConfig sc;
    sc.max_batch = 2;
    sc.max_step_tokens = 256;
    sc.prefill_chunk = 128;
    sc.total_blocks = 64;
    engine_ = std::make_unique<engine::Engine>(std::make_unique<ScriptedBackend>(script), sc, byte_codec());
    ModelLimits limits;
    limits.model_name = "scripted";
    limits.vocab_size = kScriptVocab;
    limits.context = 4096;
    limits.chat_template = std::make_shared<const model::ChatTemplate>(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:", "test", model::jinja::Dict{});
    ServerConfig c;
    c.host = "127.0.0.1";
    c.port = 0;
    c.reasoning_parser = reasoning_parser;
    c.tool_call_parser = tool_call_parser;
    server_ = std::make_unique<HttpServer>(*engine_, byte_codec(), limits, c);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~ScriptedServer() {
    server_->shutdown();
    thread_.join();
  }
  int port() const { return port_; }
  json chat(json body) const {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
  // The stream's deltas folded: concatenated content and reasoning, the calls, the finish.
  json chat_stream(json body) const {
    body["stream"] = true;
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    json folded{{"content", ""}, {"reasoning_content", ""}, {"tool_calls", json::array()}, {"finish_reason", nullptr},
                {"reasoning_deltas", 0}};
    for (size_t pos = 0; (pos = r->body.find("data: {", pos)) != std::string::npos;) {
      const size_t end = r->body.find("\n\n", pos);
      const json j = json::parse(r->body.substr(pos + 6, end - pos - 6));
      pos = end;
      const json& delta = j["choices"][0]["delta"];
      if (delta.contains("content"))
        folded["content"] = folded["content"].get<std::string>() + delta["content"].get<std::string>();
      if (delta.contains("reasoning_content")) {
        folded["reasoning_content"] =
            folded["reasoning_content"].get<std::string>() + delta["reasoning_content"].get<std::string>();
        folded["reasoning_deltas"] = folded["reasoning_deltas"].get<int>() + 1;
      }
      if (delta.contains("tool_calls")) folded["tool_calls"].push_back(delta["tool_calls"][0]["function"]);
      if (!j["choices"][0]["finish_reason"].is_null()) folded["finish_reason"] = j["choices"][0]["finish_reason"];
    }
    return folded;
  }

 private:
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

json question(int max_tokens = 200) {
  return json{{"messages", json::array({{{"role", "user"}, {"content", "What is 6 x 7?"}}})},
              {"max_tokens", max_tokens},
              {"temperature", 0}};
}

std::string text_of(const json& v) { return v.is_null() ? std::string() : v.get<std::string>(); }

TEST(ReasoningServer, Qwen3SplitsTheReplyWholeAndStreamed) {
  ScriptedServer s("<think>\nsix sevens\n</think>\n\nIt is 42.", "qwen3");
  const json whole = s.chat(question());
  const json& message = whole["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "\nsix sevens\n");
  EXPECT_EQ(message["content"], "\n\nIt is 42.");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  const json streamed = s.chat_stream(question());
  EXPECT_EQ(streamed["reasoning_content"], "\nsix sevens\n");
  EXPECT_EQ(streamed["content"], "\n\nIt is 42.");
  EXPECT_EQ(streamed["finish_reason"], "stop");
}

TEST(ReasoningServer, DeepSeekR1RepliesBeginInTheReasoning) {
  ScriptedServer s("six sevens</think>42", "deepseek_r1");
  const json whole = s.chat(question());
  const json& message = whole["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "six sevens");
  EXPECT_EQ(message["content"], "42");
  const json streamed = s.chat_stream(question());
  EXPECT_EQ(streamed["reasoning_content"], "six sevens");
  EXPECT_EQ(streamed["content"], "42");
  // Cut inside the reasoning by max_tokens: all of it reasoning, no content.
  const json cut = s.chat(question(5));
  EXPECT_EQ(cut["choices"][0]["message"]["reasoning_content"], "six s");
  EXPECT_TRUE(cut["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
}

// A reply without a block is all content (reasoning_content null); without a parser the
// block stays in the content and the message has no reasoning field.
TEST(ReasoningServer, RepliesWithoutABlockOrWithoutAParser) {
  {
    ScriptedServer s("It is 42.", "qwen3");
    const json whole = s.chat(question());
    const json& message = whole["choices"][0]["message"];
    EXPECT_TRUE(message["reasoning_content"].is_null());
    EXPECT_EQ(message["content"], "It is 42.");
    EXPECT_EQ(s.chat_stream(question())["content"], "It is 42.");
  }
  ScriptedServer s("<think>a</think>42", "");
  const json whole = s.chat(question());
  const json& message = whole["choices"][0]["message"];
  EXPECT_FALSE(message.contains("reasoning_content"));
  EXPECT_EQ(message["content"], "<think>a</think>42");
  const json streamed = s.chat_stream(question());
  EXPECT_EQ(streamed["content"], "<think>a</think>42");
  EXPECT_EQ(streamed["reasoning_deltas"], 0);
}

// Tool calls are parsed from the content after the reasoning; a call written inside the
// reasoning is reasoning.
TEST(ReasoningServer, ToolCallsComeFromTheContent) {
  const std::string call = "<tool_call>\n{\"name\": \"multiply\", \"arguments\": {\"a\": 6, \"b\": 7}}\n</tool_call>";
  json body = question();
  body["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "multiply"}}}}});
  {
    ScriptedServer s("<think>use the tool</think>\n\n" + call, "qwen3", kHermesToolCalls);
    const json whole = s.chat(body);
    const json& message = whole["choices"][0]["message"];
    EXPECT_EQ(message["reasoning_content"], "use the tool");
    EXPECT_EQ(text_of(message["content"]), "\n\n");
    ASSERT_EQ(message["tool_calls"].size(), 1u);
    EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "multiply");
    EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
    const json streamed = s.chat_stream(body);
    EXPECT_EQ(streamed["reasoning_content"], "use the tool");
    EXPECT_EQ(streamed["content"], "\n\n");
    ASSERT_EQ(streamed["tool_calls"].size(), 1u);
    EXPECT_EQ(streamed["tool_calls"][0]["name"], "multiply");
    EXPECT_EQ(streamed["finish_reason"], "tool_calls");
  }
  ScriptedServer s("<think>" + call + "</think>no call", "qwen3", kHermesToolCalls);
  const json whole = s.chat(body);
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning_content"], call);
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "no call");
  EXPECT_FALSE(whole["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
}

// n choices of a chat: each split on its own, whole and streamed (a role chunk per choice).
TEST(ReasoningServer, SeveralChoicesEachSplit) {
  ScriptedServer s("<think>a</think>42", "qwen3");
  json body = question();
  body["n"] = 2;
  const json whole = s.chat(body);
  ASSERT_EQ(whole["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(whole["choices"][i]["index"], i);
    EXPECT_EQ(whole["choices"][i]["message"]["reasoning_content"], "a");
    EXPECT_EQ(whole["choices"][i]["message"]["content"], "42");
  }
  body["stream"] = true;
  httplib::Client c("127.0.0.1", s.port());
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::vector<std::string> reasoning(2), content(2);
  std::vector<int> roles(2, 0);
  for (size_t pos = 0; (pos = r->body.find("data: {", pos)) != std::string::npos;) {
    const size_t end = r->body.find("\n\n", pos);
    const json j = json::parse(r->body.substr(pos + 6, end - pos - 6));
    pos = end;
    const size_t i = j["choices"][0]["index"].get<size_t>();
    const json& delta = j["choices"][0]["delta"];
    if (delta.contains("role")) ++roles[i];
    if (delta.contains("reasoning_content")) reasoning[i] += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content[i] += delta["content"].get<std::string>();
  }
  EXPECT_EQ(roles, (std::vector<int>{1, 1}));
  EXPECT_EQ(reasoning, (std::vector<std::string>{"a", "a"}));
  EXPECT_EQ(content, (std::vector<std::string>{"42", "42"}));
}

TEST(ReasoningServer, AnUnknownParserIsRefused) {
  ServerConfig c;
  c.reasoning_parser = "r1";
  EXPECT_THROW(HttpServer{c}, Error);
}

}  // namespace
}  // namespace fp4kv::serve
