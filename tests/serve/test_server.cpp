// The real server on 127.0.0.1 (a port the OS picks) over the pk8l CPU engine, talked to
// with a real HTTP client: completions equal the engine's generation alone, streams
// concatenate to the whole text, concurrent clients share the batch, every error status,
// the API key, a client leaving mid-stream frees its blocks, shutdown ends streams; and the
// CLI as a child process, stopped by SIGTERM.
#include <httplib.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fp4kv/engine/cpu_generator.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "tests/model/fixtures.h"
#include "fp4kv/serve/cpu_engine.h"
#include "fp4kv/serve/load_client.h"
#include "fp4kv/serve/server.h"

namespace fp4kv::serve {
namespace {

using nlohmann::json;

constexpr int kMaxPolls = 600;  // bounded waits: polls of kPollPause
constexpr std::chrono::milliseconds kPollPause{100};
constexpr int kLongRequestTokens = 4000;  // outlives any disconnect or shutdown in the tests
constexpr time_t kClientTimeoutSeconds = 120;

CpuServeSetup pk8l_setup() {
  CpuServeSetup s;
  s.model_dir = std::string(FP4KV_SOURCE_DIR) + "/models/pk8l";
  s.kv = "nvfp4";
  s.max_batch = 4;
  return s;
}

// A server on a background thread; stopped and joined on destruction.
class RunningServer {
 public:
  explicit RunningServer(const std::string& api_key = "", const CpuServeSetup& setup = pk8l_setup(),
                         std::shared_ptr<const model::ChatTemplate> chat_template = nullptr,
                         const std::string& tool_call_parser = "")
      : serving_(load_cpu_serving(setup)) {
    ServerConfig c;
    c.host = "127.0.0.1";
    c.port = 0;
    c.api_key = api_key;
    c.chat_template = std::move(chat_template);
    c.tool_call_parser = tool_call_parser;
    server_ = std::make_unique<HttpServer>(*serving_.engine, serving_.codec, serving_.limits, c);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  ~RunningServer() { stop(); }
  void stop() {
    server_->shutdown();
    if (thread_.joinable()) thread_.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(kClientTimeoutSeconds, 0);
    return c;
  }
  HttpServer& server() { return *server_; }
  int port() const { return port_; }
  CpuServing& serving() { return serving_; }

 private:
  CpuServing serving_;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

// The completion text of `prompt` generated alone on the serving's model and tokenizer (invalid
// UTF-8 replaced, as the API does);
// `choice` of a seeded request with n choices draws with request id kSeededRequestId + choice.
std::string alone(CpuServing& s, const std::string& prompt, int max_tokens, float temperature, uint64_t seed,
                  int choice = 0) {
  engine::GenerateOptions o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = temperature;
  o.sampling.seed = seed;
  o.sampling.request_id = kSeededRequestId + uint64_t(choice);
  std::vector<int> out;
  engine::generate_on_cpu(*s.model, eval::recipe_attention(s.model->config(), s.recipe, s.calibration.get()),
                          s.codec.encode(prompt), o, [&out](int t) { out.push_back(t); });
  return sanitize_utf8(s.codec.decode(out));
}

json request(const std::string& prompt, int max_tokens, float temperature = 0, uint64_t seed = 0) {
  return json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", temperature}, {"seed", seed}};
}

json post_json(httplib::Client& c, const json& body, int expect_status = 200,
               const std::string& path = "/v1/completions") {
  auto r = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response";
  if (!r) return json();
  EXPECT_EQ(r->status, expect_status) << r->body;
  return json::parse(r->body, nullptr, false);
}

// The text of an SSE body; `done` says whether it ended with [DONE].
std::string sse_text(const std::string& body, bool* done, std::string* finish = nullptr) {
  std::string text;
  *done = false;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    EXPECT_FALSE(*done) << "an event after [DONE]";
    if (payload == "[DONE]") {
      *done = true;
      continue;
    }
    const json j = json::parse(payload);
    if (j["choices"].empty()) continue;
    text += j["choices"][0]["text"].get<std::string>();
    if (finish && !j["choices"][0]["finish_reason"].is_null()) *finish = j["choices"][0]["finish_reason"];
  }
  return text;
}

// POSTs a completion, handing each piece of the response body to `receive` (false: leave).
void post_streaming(httplib::Client& c, const json& body, std::function<bool(const char*, size_t)> receive) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [receive](const char* d, size_t n, uint64_t, uint64_t) { return receive(d, n); };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  c.send(req, res, err);
}

double metric(const RunningServer& s, const std::string& name) { return server_metric("127.0.0.1", s.port(), name); }

TEST(Server, CompletionEqualsGenerationAlone) {
  RunningServer s;
  httplib::Client c = s.client();
  const json greedy = post_json(c, request("Hello", 8));
  EXPECT_EQ(greedy["choices"][0]["text"], alone(s.serving(), "Hello", 8, 0, 0));
  EXPECT_EQ(greedy["usage"]["prompt_tokens"], int(model::encode_bytes("Hello").size()));
  EXPECT_EQ(greedy["usage"]["total_tokens"].get<int>(),
            greedy["usage"]["prompt_tokens"].get<int>() + greedy["usage"]["completion_tokens"].get<int>());
  const json sampled = post_json(c, request("Once upon", 10, 0.9f, 5));
  EXPECT_EQ(sampled["choices"][0]["text"], alone(s.serving(), "Once upon", 10, 0.9f, 5));
  const std::string finish = sampled["choices"][0]["finish_reason"];
  EXPECT_TRUE(finish == "length" || finish == "stop") << finish;
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "pk8l");
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// A checkpoint with a subword vocabulary is served through the tokenizer.json beside it
// (fixtures.h write_bpe_checkpoint): the prompt counts its BPE tokens, and the completion is the
// tokens the engine draws alone, decoded by that tokenizer.
TEST(Server, ASubwordCheckpointIsServedThroughItsTokenizer) {
  const json cases = model::testing::read_bpe_fixture("tiny_bpe_cases.json");
  ASSERT_EQ(cases["encode"][1]["text"], "Hello, world!");
  model::testing::TempDir dir;
  model::testing::write_bpe_checkpoint(dir.str());
  CpuServeSetup setup;
  setup.model_dir = dir.str();
  setup.kv = "bf16";
  setup.max_batch = 2;
  RunningServer s("", setup);
  httplib::Client c = s.client();
  const json r = post_json(c, request("Hello, world!", 6));
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<int>(), int(cases["encode"][1]["ids"].size()));
  EXPECT_EQ(r["choices"][0]["text"], alone(s.serving(), "Hello, world!", 6, 0, 0));
}

// A subword checkpoint whose tokenizer_config.json carries a chat template in the form of
// Qwen3's (the fixture's, checked against Jinja2 in tests/model) and <|im_end|> as EOS.
void write_chat_checkpoint(const std::string& dir) {
  model::testing::write_bpe_checkpoint(dir);
  const json fixture = model::testing::read_bpe_fixture("chat_template_cases.json");
  const json config{
      {"chat_template", fixture["templates"]["qwen3"]}, {"eos_token", "<|im_end|>"}, {"bos_token", nullptr}};
  model::testing::write_text(dir + "/tokenizer_config.json", config.dump());
}

json chat_request(const json& messages, int max_tokens) {
  return json{{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}, {"seed", 0}};
}

CpuServeSetup chat_setup(const std::string& dir) {
  CpuServeSetup setup;
  setup.model_dir = dir;
  setup.kv = "bf16";
  setup.max_batch = 2;
  return setup;
}

// A chat completion is the completion of the conversation as the template writes it: the
// ChatML text, its markers encoded as the tokenizer's special tokens.
TEST(Server, AChatCompletionIsTheCompletionOfTheRenderedConversation) {
  model::testing::TempDir dir;
  write_chat_checkpoint(dir.str());
  RunningServer s("", chat_setup(dir.str()));
  httplib::Client c = s.client();
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Hello, world!"}}});
  const std::string rendered =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n";
  const json r = post_json(c, chat_request(messages, 6), 200, "/v1/chat/completions");
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], alone(s.serving(), rendered, 6, 0, 0));
  const std::vector<int> ids = s.serving().codec.encode(rendered);
  EXPECT_EQ(r["usage"]["prompt_tokens"].get<int>(), int(ids.size()));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 857), 3);  // <|im_start|> as one token each time
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 858), 2);  // <|im_end|>

  // enable_thinking through chat_template_kwargs, text parts joined with a newline.
  json body = chat_request(json::array({{{"role", "user"},
                                         {"content", json::array({{{"type", "text"}, {"text", "Hello,"}},
                                                                  {{"type", "text"}, {"text", "world!"}}})}}}),
                           5);
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  const std::string no_think =
      "<|im_start|>user\nHello,\nworld!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  EXPECT_EQ(post_json(c, body, 200, "/v1/chat/completions")["choices"][0]["message"]["content"],
            alone(s.serving(), no_think, 5, 0, 0));
}

// The stream: the assistant's role first, then content deltas that concatenate to the whole
// reply, a last chunk with the finish reason, the usage chunk, [DONE]; logprobs per token.
TEST(Server, AChatStreamConcatenatesToTheWholeReply) {
  model::testing::TempDir dir;
  write_chat_checkpoint(dir.str());
  RunningServer s("", chat_setup(dir.str()));
  httplib::Client c = s.client();
  json body = chat_request(json::array({{{"role", "user"}, {"content", "The quick brown fox"}}}), 8);
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  const json whole = post_json(c, body, 200, "/v1/chat/completions");
  const int produced = whole["usage"]["completion_tokens"].get<int>();
  ASSERT_EQ(whole["choices"][0]["logprobs"]["content"].size(), size_t(produced));
  for (const json& t : whole["choices"][0]["logprobs"]["content"]) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_TRUE(t["bytes"].is_array());
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text, finish;
  bool role_first = false, done = false, usage = false;
  int events = 0;
  size_t pos = 0, logprob_tokens = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json j = json::parse(payload);
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    if (j["choices"].empty()) {
      usage = j["usage"]["completion_tokens"].get<int>() == produced;
      continue;
    }
    const json& delta = j["choices"][0]["delta"];
    if (events++ == 0) role_first = delta.value("role", "") == "assistant";
    if (delta.contains("content")) text += delta["content"].get<std::string>();
    if (!j["choices"][0]["logprobs"].is_null()) logprob_tokens += j["choices"][0]["logprobs"]["content"].size();
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(role_first);
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(logprob_tokens, size_t(produced));
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
  EXPECT_TRUE(usage);
  EXPECT_TRUE(done);
}

// With the hermes parser, tools (tool_choice "auto") render into the prompt and the reply
// goes through the parser, whole or streamed: a reply without <tool_call> blocks is content.
TEST(Server, ToolsAreRenderedAndTheReplyParsed) {
  model::testing::TempDir dir;
  write_chat_checkpoint(dir.str());
  RunningServer s("", chat_setup(dir.str()), nullptr, kHermesToolCalls);
  httplib::Client c = s.client();
  const json messages = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}}});
  json body = chat_request(messages, 6);
  body["tools"] = tools;
  const json whole = post_json(c, body, 200, "/v1/chat/completions");
  model::ChatInput input;
  input.messages_json = messages.dump();
  input.tools_json = tools.dump();
  const std::string rendered = s.serving().limits.chat_template->render(input);
  EXPECT_NE(rendered.find("<tools>\n{\"function\": {\"name\": \"get_weather\""), std::string::npos) << rendered;
  const ParsedReply expected = parse_tool_calls(alone(s.serving(), rendered, 6, 0, 0));
  const json& message = whole["choices"][0]["message"];
  EXPECT_EQ(message.contains("tool_calls"), !expected.calls.empty());
  if (expected.calls.empty()) {
    EXPECT_EQ(message["content"], expected.content);
  }
  body["stream"] = true;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text, finish;
  size_t pos = 0;
  while ((pos = r->body.find("data: {", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const json j = json::parse(r->body.substr(pos + 6, end - pos - 6));
    pos = end;
    if (j["choices"].empty()) continue;
    if (j["choices"][0]["delta"].contains("content")) text += j["choices"][0]["delta"]["content"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, message["content"].is_null() ? "" : message["content"].get<std::string>());
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);
}

// pk8l with a generation_config.json recommending sampling defaults (its other files linked).
void write_pk8l_with_defaults(const std::string& dir, const std::string& generation_config) {
  const std::filesystem::path pk8l = std::filesystem::path(FP4KV_SOURCE_DIR) / "models/pk8l";
  for (const auto& entry : std::filesystem::directory_iterator(pk8l))
    if (entry.path().filename() != "generation_config.json")
      std::filesystem::create_symlink(entry.path(), std::filesystem::path(dir) / entry.path().filename());
  model::testing::write_text(dir + "/generation_config.json", generation_config);
}

// A request that leaves the sampling fields and max_tokens out draws with the checkpoint's
// generation_config.json values (as vLLM's --generation-config auto), its own values win, and
// the operator's defaults (ServerConfig::request_defaults, --generation-config) replace the file's.
TEST(Server, RequestsLeavingSamplingOutGetTheCheckpointsDefaults) {
  model::testing::TempDir dir;
  write_pk8l_with_defaults(dir.str(), R"({"eos_token_id": 257, "temperature": 0.7, "top_p": 0.9, "top_k": 5,
                                         "max_new_tokens": 7})");
  CpuServeSetup setup = pk8l_setup();
  setup.model_dir = dir.str();
  setup.max_model_len = 200;
  RunningServer s("", setup);
  EXPECT_FLOAT_EQ(s.serving().limits.defaults.temperature, 0.7f);
  auto generated_alone = [&](const SamplingRow& sampling, int max_tokens) {
    engine::GenerateOptions o;
    o.max_tokens = max_tokens;
    o.sampling = sampling;
    o.sampling.request_id = kSeededRequestId;
    o.stop_at_eos = false;
    std::vector<int> out;
    engine::generate_on_cpu(*s.serving().model,
                            eval::recipe_attention(s.serving().model->config(), s.serving().recipe,
                                                   s.serving().calibration.get()),
                            s.serving().codec.encode("Once upon"), o, [&out](int t) { out.push_back(t); });
    return sanitize_utf8(s.serving().codec.decode(out));
  };
  SamplingRow recommended;
  recommended.temperature = 0.7f;
  recommended.top_p = 0.9f;
  recommended.top_k = 5;
  recommended.seed = 3;
  httplib::Client c = s.client();
  const json r = post_json(c, json{{"prompt", "Once upon"}, {"seed", 3}, {"ignore_eos", true}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 7);  // max_new_tokens
  EXPECT_EQ(r["choices"][0]["text"], generated_alone(recommended, 7));
  // Near the end of the context it gets what is left (197 prompt tokens of 200).
  const json near = post_json(c, json{{"prompt", std::string(196, 'a')}, {"seed", 3}, {"ignore_eos", true}});
  EXPECT_EQ(near["usage"]["completion_tokens"], 3);
  SamplingRow own = recommended;
  own.temperature = 1.3f;
  own.top_k = 0;
  const json mine =
      post_json(c, json{{"prompt", "Once upon"}, {"seed", 3}, {"ignore_eos", true}, {"temperature", 1.3}, {"top_k", -1},
                        {"max_tokens", 9}});
  EXPECT_EQ(mine["choices"][0]["text"], generated_alone(own, 9));
  s.stop();

  ServerConfig config;  // --generation-config vllm: OpenAI's defaults
  config.host = "127.0.0.1";
  config.port = 0;
  config.request_defaults = RequestDefaults{};
  CpuServing serving = load_cpu_serving(setup);
  HttpServer server(*serving.engine, serving.codec, serving.limits, config);
  const int port = server.bind();
  std::thread run([&server] { server.run(); });
  httplib::Client openai("127.0.0.1", port);
  openai.set_read_timeout(kClientTimeoutSeconds, 0);
  const json plain = post_json(openai, json{{"prompt", "Once upon"}, {"seed", 3}, {"ignore_eos", true}});
  EXPECT_EQ(plain["usage"]["completion_tokens"], kDefaultMaxTokens);
  SamplingRow unit;
  unit.temperature = 1.0f;
  unit.seed = 3;
  EXPECT_EQ(plain["choices"][0]["text"], generated_alone(unit, kDefaultMaxTokens));
  server.shutdown();
  run.join();
}

// n choices: each one the generation alone with its own draws (a seeded request's choice i with
// request id kSeededRequestId + i, choice 0 as with n = 1), whole or streamed (deltas tagged by
// index, one finish chunk each, the usage summed, one [DONE]).
TEST(Server, SeveralChoices) {
  RunningServer s;
  httplib::Client c = s.client();
  json body = request("Once upon", 8, 0.9f, 11);
  body["n"] = 3;
  body["ignore_eos"] = true;
  const json whole = post_json(c, body);
  ASSERT_EQ(whole["choices"].size(), 3u);
  std::vector<std::string> expected;
  for (int i = 0; i < 3; ++i) {
    expected.push_back(alone(s.serving(), "Once upon", 8, 0.9f, 11, i));
    EXPECT_EQ(whole["choices"][i]["index"], i);
    EXPECT_EQ(whole["choices"][i]["text"], expected.back());
    EXPECT_EQ(whole["choices"][i]["finish_reason"], "length");
  }
  EXPECT_NE(expected[0], expected[1]);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 24);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::vector<std::string> texts(3);
  std::vector<int> finishes(3, 0);
  int dones = 0, usage_chunks = 0;
  for (size_t pos = 0; (pos = r->body.find("data: ", pos)) != std::string::npos;) {
    const size_t end = r->body.find("\n\n", pos);
    const std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      ++dones;
      continue;
    }
    const json j = json::parse(payload);
    if (j["choices"].empty()) {
      ++usage_chunks;
      EXPECT_EQ(j["usage"]["completion_tokens"], 24);
      continue;
    }
    const int i = j["choices"][0]["index"];
    texts[size_t(i)] += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) ++finishes[size_t(i)];
  }
  EXPECT_EQ(texts, expected);
  EXPECT_EQ(finishes, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_EQ(dones, 1);
  EXPECT_EQ(metric(s, "fp4kv_requests_running"), 0);
}

// Several prompts with n choices each: completion p * n + i is choice i of prompt p, each
// prompt drawing as in a request of its own; prompts of texts or of token ids; usage summed.
TEST(Server, SeveralPrompts) {
  RunningServer s;
  httplib::Client c = s.client();
  json body = request("", 5, 0.8f, 4);
  body["prompt"] = {"Once upon", "Hello"};
  body["n"] = 2;
  body["ignore_eos"] = true;
  const json whole = post_json(c, body);
  ASSERT_EQ(whole["choices"].size(), 4u);
  const std::vector<std::string> prompts = {"Once upon", "Hello"};
  for (int p = 0; p < 2; ++p)
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(whole["choices"][p * 2 + i]["index"], p * 2 + i);
      EXPECT_EQ(whole["choices"][p * 2 + i]["text"], alone(s.serving(), prompts[size_t(p)], 5, 0.8f, 4, i));
    }
  const int prompt_tokens = int(model::encode_bytes("Once upon").size() + model::encode_bytes("Hello").size());
  EXPECT_EQ(whole["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 20);
  body["prompt"] = {model::encode_bytes("Once upon"), model::encode_bytes("Hello")};
  EXPECT_EQ(post_json(c, body)["choices"], whole["choices"]);
  body["stream"] = true;
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  std::vector<std::string> texts(4);
  for (size_t pos = 0; (pos = r->body.find("data: {", pos)) != std::string::npos;) {
    const size_t end = r->body.find("\n\n", pos);
    const json j = json::parse(r->body.substr(pos + 6, end - pos - 6));
    pos = end;
    texts[j["choices"][0]["index"].get<size_t>()] += j["choices"][0]["text"].get<std::string>();
  }
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(texts[k], whole["choices"][k]["text"]);
}

// --max-model-len: the context requests are checked against and /v1/models reports.
TEST(Server, MaxModelLenBoundsRequests) {
  CpuServeSetup setup = pk8l_setup();
  setup.max_model_len = 200;
  RunningServer s("", setup);
  httplib::Client c = s.client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["max_model_len"], 200);
  EXPECT_EQ(post_json(c, request(std::string(190, 'a'), 20), 400)["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(post_json(c, request("Hello", 200), 400)["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(post_json(c, request(std::string(180, 'a'), 10))["usage"]["prompt_tokens"], 181);  // BOS + bytes
  setup.max_model_len = 40000;  // beyond pk8l's 32768 positions
  EXPECT_THROW(load_cpu_serving(setup), Error);
}

// --served-model-name: /v1/models lists the names, responses carry the first, requests may
// name any, and the directory's name is no longer one of them.
TEST(Server, ServedModelNames) {
  CpuServing serving = load_cpu_serving(pk8l_setup());
  ServerConfig config;
  config.host = "127.0.0.1";
  config.port = 0;
  config.served_model_names = {"Qwen/Qwen3-4B", "qwen3"};
  HttpServer server(*serving.engine, serving.codec, serving.limits, config);
  const int port = server.bind();
  std::thread run([&server] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(kClientTimeoutSeconds, 0);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json data = json::parse(models->body)["data"];
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0]["id"], "Qwen/Qwen3-4B");
  EXPECT_EQ(data[1]["id"], "qwen3");
  auto one = c.Get("/v1/models/Qwen/Qwen3-4B");  // OpenAI's retrieve, names with slashes too
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(json::parse(one->body), data[0]);
  auto unknown = c.Get("/v1/models/pk8l");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(json::parse(unknown->body)["error"]["code"], "model_not_found");
  json body = request("Hello", 2);
  body["model"] = "qwen3";
  EXPECT_EQ(post_json(c, body)["model"], "Qwen/Qwen3-4B");
  body["model"] = "pk8l";
  EXPECT_EQ(post_json(c, body, 404)["error"]["code"], "model_not_found");
  server.shutdown();
  run.join();
}

// /tokenize gives the ids a completion feeds (a prompt through the tokenizer, a chat through
// the template first), /detokenize the text back; both checked and guarded by the API key.
TEST(Server, TokenizeAndDetokenize) {
  model::testing::TempDir dir;
  write_chat_checkpoint(dir.str());
  RunningServer s("key", chat_setup(dir.str()));
  httplib::Client c = s.client();
  c.set_bearer_token_auth("key");
  auto post = [&c](const std::string& path, const json& body, int status) {
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, status) << r->body;
    return json::parse(r->body, nullptr, false);
  };
  const json text = post("/tokenize", json{{"prompt", "Hello, world!"}}, 200);
  const std::vector<int> ids = s.serving().codec.encode("Hello, world!");
  EXPECT_EQ(text["tokens"].get<std::vector<int>>(), ids);
  EXPECT_EQ(text["count"], ids.size());
  EXPECT_EQ(text["max_model_len"], s.serving().limits.context);
  const json messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const json chat = post("/tokenize", json{{"messages", messages}}, 200);
  model::ChatInput input;
  input.messages_json = messages.dump();
  EXPECT_EQ(chat["tokens"].get<std::vector<int>>(),
            s.serving().codec.encode(s.serving().limits.chat_template->render(input)));
  const json plain = post("/tokenize", json{{"prompt", "Hello, world!"}, {"add_special_tokens", false}}, 200);
  EXPECT_EQ(plain["tokens"], text["tokens"]);  // the BPE adds no special tokens
  const json back = post("/detokenize", json{{"tokens", ids}}, 200);
  EXPECT_EQ(back["prompt"], "Hello, world!");
  EXPECT_EQ(post("/detokenize", json{{"tokens", {-3}}}, 400)["error"]["code"], "invalid_request");
  EXPECT_EQ(post("/tokenize", json{{"text", "x"}}, 400)["error"]["code"], "missing_field");
  httplib::Client anonymous = s.client();
  auto refused = anonymous.Post("/tokenize", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
}

// pk8l's byte tokenizer puts a BOS first as prompts are fed; add_special_tokens false leaves it out.
TEST(Server, TokenizeWithoutSpecialTokens) {
  RunningServer s;
  httplib::Client c = s.client();
  const json fed = post_json(c, json{{"prompt", "Hi"}}, 200, "/tokenize");
  EXPECT_EQ(fed["tokens"], model::encode_bytes("Hi"));
  const json text = post_json(c, json{{"prompt", "Hi"}, {"add_special_tokens", false}}, 200, "/tokenize");
  EXPECT_EQ(text["tokens"], model::encode_bytes("Hi", false));
  EXPECT_EQ(text["count"], 2);
}

// Without a template the endpoint says so; the operator's template serves any checkpoint and
// its raise_exception is the client's 400; tools need tool_choice "none".
TEST(Server, ChatErrorsSayWhy) {
  {
    RunningServer s;  // pk8l: no chat template
    httplib::Client c = s.client();
    const json e = post_json(c, chat_request(json::array({{{"role", "user"}, {"content", "hi"}}}), 4), 400,
                             "/v1/chat/completions");
    EXPECT_EQ(e["error"]["code"], "no_chat_template");
  }
  const auto chat = std::make_shared<const model::ChatTemplate>(
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system prompts, please') }}{% endif %}"
      "{{ m.content }}\n{% endfor %}",
      "test", model::jinja::Dict{});
  RunningServer s("", pk8l_setup(), chat);
  httplib::Client c = s.client();
  const json user = json::array({{{"role", "user"}, {"content", "The cat sat on the"}}});
  EXPECT_EQ(post_json(c, chat_request(user, 6), 200, "/v1/chat/completions")["choices"][0]["message"]["content"],
            alone(s.serving(), "The cat sat on the\n", 6, 0, 0));
  const json refused = post_json(c, chat_request(json::array({{{"role", "system"}, {"content", "x"}}}), 4), 400,
                                 "/v1/chat/completions");
  EXPECT_EQ(refused["error"]["code"], "chat_template_refused");
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("no system prompts, please"), std::string::npos);
  json tools = chat_request(user, 4);
  tools["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  EXPECT_EQ(post_json(c, tools, 400, "/v1/chat/completions")["error"]["code"], "unsupported");
  tools["tool_choice"] = "none";
  post_json(c, tools, 200, "/v1/chat/completions");
  EXPECT_EQ(metric(s, "fp4kv_kv_blocks_used"), 0);
}

TEST(Server, StreamConcatenatesToTheWholeText) {
  RunningServer s;
  httplib::Client c = s.client();
  json body = request("The quick brown fox", 12, 0.8f, 3);
  const std::string whole = post_json(c, body)["choices"][0]["text"];
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  bool done = false;
  EXPECT_EQ(sse_text(r->body, &done), whole);
  EXPECT_TRUE(done);
  EXPECT_NE(r->body.find("\"usage\""), std::string::npos);
}

// logprobs: one entry per generated token in both modes, the tokens' bytes making up the
// text, greedy tokens being their own most likely alternative, log-probabilities <= 0.
TEST(Server, LogprobsFollowEveryToken) {
  RunningServer s;
  httplib::Client c = s.client();
  json body = request("Hello", 8);
  body["logprobs"] = 3;
  const json whole = post_json(c, body);
  const json& lp = whole["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << whole.dump();
  const int n = whole["usage"]["completion_tokens"].get<int>();
  ASSERT_EQ(int(lp["tokens"].size()), n);
  ASSERT_EQ(int(lp["token_logprobs"].size()), n);
  std::string joined;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size());
    joined += lp["tokens"][i].get<std::string>();
    const float chosen = lp["token_logprobs"][i].get<float>();
    EXPECT_LE(chosen, 0.0f);
    const json& top = lp["top_logprobs"][i];
    ASSERT_FALSE(top.empty());
    float best = -1e30f;
    for (auto it = top.begin(); it != top.end(); ++it) best = std::max(best, it.value().get<float>());
    EXPECT_FLOAT_EQ(chosen, best) << "greedy draws the most likely token";
  }
  EXPECT_EQ(joined, whole["choices"][0]["text"].get<std::string>());
  // Streamed: the chunks' logprobs together cover every token.
  body["stream"] = true;
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  int streamed = 0;
  size_t pos = 0;
  while ((pos = r->body.find("data: {", pos)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", pos);
    const json chunk = json::parse(r->body.substr(pos + 6, end - pos - 6));
    pos = end;
    if (!chunk["choices"].empty() && chunk["choices"][0]["logprobs"].is_object())
      streamed += int(chunk["choices"][0]["logprobs"]["tokens"].size());
  }
  EXPECT_EQ(streamed, n);
}

// 16 clients at once (half streaming, half sampled), each receiving its own request's text,
// equal to that request run alone: no mixing of streams in the shared batch.
TEST(Server, SixteenConcurrentClientsEachGetTheirOwnStream) {
  RunningServer s;
  const std::vector<std::string> seeds = {"abc", "Hello there", "1 2 3 4", "To be or", "xyz", "Once", "The cat",
                                          "In the"};
  constexpr int kClients = 16;
  std::vector<std::string> prompts, got(kClients);
  for (int i = 0; i < kClients; ++i) prompts.push_back(seeds[i % seeds.size()] + std::string(i / 8, '!'));
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c = s.client();
      json body = request(prompts[i], 4 + i % 5, i % 2 ? 0.7f : 0.0f, 11 + i);
      if (i % 2) body["stream"] = true;
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      if (!r || r->status != 200) {
        got[i] = r ? "status " + std::to_string(r->status) + ": " + r->body
                   : "client " + std::to_string(i) + " error " + httplib::to_string(r.error());
        return;
      }
      bool done = true;
      got[i] = i % 2 ? sse_text(r->body, &done) : json::parse(r->body)["choices"][0]["text"].get<std::string>();
    });
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i)
    EXPECT_EQ(got[i], alone(s.serving(), prompts[i], 4 + i % 5, i % 2 ? 0.7f : 0.0f, 11 + i)) << prompts[i];
  s.stop();
  s.serving().engine->check_blocks();
  EXPECT_EQ(s.serving().engine->counters().blocks_used, 0);
}

// curl, the client users reach for first: a streamed completion through it has the text of
// the request run alone.
TEST(Server, CurlStreamsACompletion) {
  if (std::system("curl --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "curl is not installed";
  RunningServer s;
  const std::string body = request("Hello", 8).dump();
  json streamed = json::parse(body);
  streamed["stream"] = true;
  const std::string cmd = "curl -sN --max-time 120 -H 'Content-Type: application/json' -d '" + streamed.dump() +
                          "' http://127.0.0.1:" + std::to_string(s.port()) + "/v1/completions";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_TRUE(p);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  EXPECT_EQ(pclose(p), 0);
  bool done = false;
  EXPECT_EQ(sse_text(out, &done), alone(s.serving(), "Hello", 8, 0, 0)) << out;
  EXPECT_TRUE(done) << out;
}

// A bounded soak through the load generator (serve/load_client.h): 16 clients x 4 streams,
// a quarter abandoned by their client after the first event; every other stream completes,
// none fails, and the server ends with no running request and no KV block in use.
TEST(Server, LoadRunWithLeavingClientsEndsWithNoBlocksInUse) {
  RunningServer s;
  LoadOptions o;
  o.port = s.port();
  o.clients = 16;
  o.requests_per_client = 4;
  o.max_tokens = 6;
  o.cancel_fraction = 0.25;
  o.seed = 5;
  const LoadReport rep = run_load(o);
  std::printf("%s", rep.table().c_str());
  EXPECT_EQ(rep.sent, 64);
  EXPECT_EQ(rep.failed, 0) << rep.table();
  EXPECT_EQ(rep.completed + rep.cancelled, rep.sent);
  EXPECT_GT(rep.cancelled, 0);
  EXPECT_GT(rep.completed, 0);
  EXPECT_EQ(rep.running_after, 0);
  EXPECT_EQ(rep.blocks_used_after, 0);
  s.stop();
  s.serving().engine->check_blocks();
}

TEST(Server, ErrorsAreJsonWithTheirStatus) {
  RunningServer s;
  httplib::Client c = s.client();
  auto expect_error = [](const httplib::Result& r, int status) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, status) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r->body;
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("code")) << r->body;
  };
  expect_error(c.Post("/v1/completions", "{not json", "application/json"), 400);
  expect_error(c.Post("/v1/completions", R"({"prompt":"a","max_tokens":"x"})", "application/json"), 400);
  expect_error(c.Post("/v1/completions", R"({"prompt":"a","n":100})", "application/json"), 400);
  expect_error(c.Post("/v1/completions", R"({"prompt":"a","max_tokens":100000})", "application/json"), 400);
  expect_error(c.Post("/v1/completions", json{{"prompt", std::string(40000, 'a')}}.dump(), "application/json"), 400);
  expect_error(c.Post("/v1/chat/completions", R"({"messages":[]})", "application/json"), 400);
  expect_error(c.Get("/v1/nothing"), 404);
  expect_error(c.Post("/v1/completions", std::string(kMaxBodyBytes + 1, ' '), "application/json"), 413);
  // Still serving, nothing leaked.
  EXPECT_EQ(post_json(c, request("ok", 2))["choices"].size(), 1u);
  EXPECT_EQ(metric(s, "fp4kv_kv_blocks_used"), 0);
}

TEST(Server, ApiKeyIsRequiredOnTheApi) {
  RunningServer s("sekrit");
  httplib::Client c = s.client();
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = c.Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = c.Get("/v1/models", {{"Authorization", "Bearer sekrit"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(Server, ClientLeavingMidStreamFreesItsBlocks) {
  RunningServer s;
  httplib::Client c = s.client();
  json body = request("Hello", kLongRequestTokens);
  body["stream"] = true;
  body["ignore_eos"] = true;
  int chunks = 0;
  post_streaming(c, body, [&chunks](const char*, size_t) { return ++chunks < 2; });  // leave after 2 reads
  EXPECT_GE(chunks, 1);
  int polls = 0;
  while (polls++ < kMaxPolls &&
         (metric(s, "fp4kv_client_disconnects_total") < 1 || metric(s, "fp4kv_requests_running") != 0 ||
          metric(s, "fp4kv_kv_blocks_used") != 0))
    std::this_thread::sleep_for(kPollPause);
  EXPECT_EQ(metric(s, "fp4kv_client_disconnects_total"), 1);
  EXPECT_EQ(metric(s, "fp4kv_requests_running"), 0);
  EXPECT_EQ(metric(s, "fp4kv_kv_blocks_used"), 0);
  EXPECT_LT(metric(s, "fp4kv_generation_tokens_total"), kLongRequestTokens);
}

TEST(Server, ShutdownEndsRunningStreams) {
  RunningServer s;
  json body = request("Hello", kLongRequestTokens);
  body["stream"] = true;
  body["ignore_eos"] = true;
  std::string received;
  std::atomic<bool> started{false};
  std::thread client([&] {
    httplib::Client c = s.client();
    post_streaming(c, body, [&](const char* d, size_t n) {
      received.append(d, n);
      started = true;
      return true;
    });
  });
  for (int i = 0; i < kMaxPolls && !started; ++i) std::this_thread::sleep_for(kPollPause);
  s.stop();
  client.join();
  bool done = false;
  std::string finish;
  sse_text(received, &done, &finish);
  EXPECT_TRUE(done);
  EXPECT_EQ(finish, "cancelled");
  s.serving().engine->check_blocks();
  EXPECT_EQ(s.serving().engine->counters().blocks_used, 0);
}

// A server listening before its model is loaded answers every path 503 "loading" (a load
// balancer's health check sees it is not ready), then serves once the engine is attached.
TEST(Server, AnswersLoadingUntilAnEngineIsAttached) {
  std::optional<CpuServing> serving;  // outlives the server
  ServerConfig config;
  config.host = "127.0.0.1";
  config.port = 0;
  HttpServer server(config);
  const int port = server.bind();
  std::thread runner([&server] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(kClientTimeoutSeconds, 0);
  auto expect_loading = [](const httplib::Result& r) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    EXPECT_EQ(j["error"]["code"], "loading") << r->body;
  };
  for (const char* path : {"/health", "/metrics", "/v1/models"}) expect_loading(c.Get(path));
  expect_loading(c.Post("/v1/completions", request("The cat", 2).dump(), "application/json"));

  serving.emplace(load_cpu_serving(pk8l_setup()));
  ASSERT_TRUE(server.attach(*serving->engine, serving->codec, serving->limits));
  EXPECT_THROW(server.attach(*serving->engine, serving->codec, serving->limits), Error);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json done = post_json(c, request("The cat sat on the", 4));
  EXPECT_EQ(done["choices"][0]["text"], alone(*serving, "The cat sat on the", 4, 0, 0));
  server.shutdown();
  runner.join();

  HttpServer closed(config);  // shut down while loading: the engine is not taken
  closed.shutdown();
  EXPECT_FALSE(closed.attach(*serving->engine, serving->codec, serving->limits));
}

// Runs `fp4kv serve --model pk8l --port 0 EXTRA...`, waits for its "listening" line, asks for
// /health and a completion, then ends it with SIGTERM: it must exit 0.
void serve_complete_and_stop(const std::vector<std::string>& extra, std::string* start_lines = nullptr) {
  const std::string model = std::string(FP4KV_SOURCE_DIR) + "/models/pk8l";
  std::vector<std::string> args = {FP4KV_CLI, "serve", "--model", model, "--port", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execv(FP4KV_CLI, argv.data());
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[512];
  int port = 0;
  std::string printed;
  int bound_port = 0;  // printed before the model loads
  while (port == 0 && fgets(line, sizeof line, f)) {  // ends at EOF if the child dies
    printed += line;
    const char* bound = std::strstr(line, "bound to http://127.0.0.1:");
    if (bound) bound_port = std::atoi(bound + std::strlen("bound to http://127.0.0.1:"));
    const char* at = std::strstr(line, "listening on http://127.0.0.1:");
    if (at) port = std::atoi(at + std::strlen("listening on http://127.0.0.1:"));
  }
  EXPECT_GT(port, 0) << printed;
  EXPECT_EQ(bound_port, port) << printed;
  EXPECT_NE(printed.find("KV capacity"), std::string::npos) << printed;
  if (start_lines) *start_lines = printed;
  if (port > 0) {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    // A completion through whichever engine the command picked (the GPU one on a CUDA machine).
    auto done = c.Post("/v1/completions", R"({"prompt": "The cat sat on the", "max_tokens": 6, "temperature": 0})",
                       "application/json");
    ASSERT_TRUE(done);
    EXPECT_EQ(done->status, 200) << done->body;
    const auto j = nlohmann::json::parse(done->body);
    const int produced = j["usage"]["completion_tokens"].get<int>();
    EXPECT_GE(produced, 1) << done->body;
    EXPECT_LE(produced, 6) << done->body;
    // A chat completion when the command was given a template (pk8l has none of its own).
    const bool templated = printed.find("chat completions through the chat template") != std::string::npos;
    auto chat = c.Post("/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "The cat"}], "max_tokens": 4, "temperature": 0})",
                       "application/json");
    ASSERT_TRUE(chat);
    EXPECT_EQ(chat->status, templated ? 200 : 400) << chat->body;
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  fclose(f);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ServeCli, ServesAndExitsZeroOnSigterm) { serve_complete_and_stop({}); }

TEST(ServeCli, ServesChatCompletionsThroughATemplateFile) {
  model::testing::TempDir dir;
  model::testing::write_text(dir / "chat.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
  serve_complete_and_stop({"--chat-template", dir / "chat.jinja"});
}

// The names and request defaults in force are printed at start: pk8l's generation_config.json
// has no sampling fields (OpenAI's), a directory's file gives its own, and the file's fields
// fp4kv does not implement are named.
TEST(ServeCli, PrintsTheNamesAndRequestDefaults) {
  std::string printed;
  serve_complete_and_stop({}, &printed);
  EXPECT_NE(printed.find("model 'pk8l' (context"), std::string::npos) << printed;
  EXPECT_NE(printed.find("requests without them get temperature 1, top_p 1, top_k all (OpenAI's defaults)"),
            std::string::npos) << printed;
  model::testing::TempDir dir;
  model::testing::write_text(dir / "generation_config.json",
                             R"({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05})");
  serve_complete_and_stop({"--generation-config", dir.str(), "--served-model-name", "a", "b/c"}, &printed);
  EXPECT_NE(printed.find("model 'a', 'b/c' (context"), std::string::npos) << printed;
  EXPECT_NE(printed.find("requests without them get temperature 0.6, top_p 0.95, top_k 20 (from " +
                         (dir / "generation_config.json") + "); not applied: min_p 0.05"),
            std::string::npos) << printed;
}

std::pair<int, std::string> serve_to_exit(const std::string& args);

// A template file that is missing or outside the template language ends the command before
// the port is taken, naming the file; so do an unknown tool-call or reasoning parser and a
// --generation-config that is no source or holds a bad file.
TEST(ServeCli, ABadChatTemplateIsAClearError) {
  model::testing::TempDir dir;
  model::testing::write_text(dir / "bad.jinja", "{% for m in messages %}");
  for (const std::string& file : {dir / "bad.jinja", dir / "missing.jinja"}) {
    const auto [code, out] = serve_to_exit("--device cpu --port 0 --chat-template " + file);
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find(file), std::string::npos) << out;
  }
  const auto [code, out] = serve_to_exit("--device cpu --port 0 --tool-call-parser json");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--tool-call-parser: 'json' is not a parser"), std::string::npos) << out;
  model::testing::TempDir empty;
  for (const std::string& source : {std::string("hf"), empty.str()}) {
    const auto [gen_code, gen_out] = serve_to_exit("--device cpu --port 0 --generation-config " + source);
    EXPECT_EQ(gen_code, 2) << gen_out;
    EXPECT_NE(gen_out.find("--generation-config: "), std::string::npos) << gen_out;
  }
  model::testing::write_text(empty / "generation_config.json", R"({"top_p": 2})");
  const auto [bad_code, bad_out] = serve_to_exit("--device cpu --port 0 --generation-config " + empty.str());
  EXPECT_EQ(bad_code, 2) << bad_out;
  EXPECT_NE(bad_out.find("'top_p' must be in (0, 1]"), std::string::npos) << bad_out;
  const auto [reasoning_code, reasoning_out] = serve_to_exit("--device cpu --port 0 --reasoning-parser r1");
  EXPECT_EQ(reasoning_code, 2) << reasoning_out;
  EXPECT_NE(reasoning_out.find("--reasoning-parser: 'r1' is not a parser (qwen3, deepseek_r1)"), std::string::npos)
      << reasoning_out;
}

// Every GEMM plan serves (on a CUDA machine the GPU engine times its candidates at start with
// `tuned`; the CPU engine has no GEMM plans and ignores the option).
TEST(ServeCli, ServesWithEachGemmPlan) {
  for (const char* plans : {"tuned", "gemv"}) {
    SCOPED_TRACE(plans);
    serve_complete_and_stop({"--gemm-plans", plans});
  }
}

// Runs `fp4kv serve ARGS` to its end: the exit code and what it printed (both streams). A
// command that wrongly starts serving is stopped after kServeExitSeconds and reads as exit
// code 124 (coreutils timeout), a failure rather than a hung test.
constexpr int kServeExitSeconds = 120;
std::pair<int, std::string> serve_to_exit(const std::string& args) {
  const std::string cmd =
      "timeout " + std::to_string(kServeExitSeconds) + " " + std::string(FP4KV_CLI) + " serve " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

// A bad --prefill-chunk ends the command before the port is taken.
TEST(ServeCli, PrefillChunkBelowOneIsAClearError) {
  const auto [code, out] = serve_to_exit("--device cpu --port 0 --prefill-chunk 0");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--prefill-chunk must be >= 1"), std::string::npos) << out;
}

// So does a --gemm-plans that names no plan, on every machine.
TEST(ServeCli, UnknownGemmPlansIsAClearError) {
  const auto [code, out] = serve_to_exit("--device cpu --port 0 --gemm-plans fast");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--gemm-plans: 'fast' is none of gemv, heuristic, tuned"), std::string::npos) << out;
}

// --device cuda is the GPU engine or a clear error, never a silent CPU server: with a bad
// recipe the command ends at once either way (no device: the device message; a device: the
// recipe's).
TEST(ServeCli, DeviceCudaIsTheGpuOrAClearError) {
  const auto [code, out] = serve_to_exit("--device cuda --kv fp32 --port 0");
  EXPECT_EQ(code, 2);
  EXPECT_TRUE(out.find("no CUDA device") != std::string::npos || out.find("this build has no CUDA") != std::string::npos ||
              out.find("fp32 is the exact reference") != std::string::npos)
      << out;
}

// --tensor-parallel above 1 ends the command before the port is taken, saying why (the model
// does not split; the CPU engine does not split), on any machine.
TEST(ServeCli, TensorParallelAboveOneIsAClearError) {
  for (const auto& [ranks, message] :
       {std::pair<int, const char*>{3, "num_key_value_heads 2"}, {2, "the CPU engine runs on one machine"}}) {
    const auto [code, out] = serve_to_exit("--model " + std::string(FP4KV_SOURCE_DIR) +
                                           "/models/pk8l --device cpu --port 0 --tensor-parallel " +
                                           std::to_string(ranks));
    EXPECT_EQ(code, 2) << out;
    EXPECT_NE(out.find(message), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace fp4kv::serve
