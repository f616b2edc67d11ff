#include "fp4kv/serve/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <httplib.h>

#include <chrono>
#include <climits>
#include <random>
#include <thread>

#include "fp4kv/core/error.h"

namespace fp4kv::serve {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// How long a handler waits on the engine before checking its client and the shutdown flag.
constexpr std::chrono::milliseconds kPollInterval{100};
// Reading a cancelled request's stream to its end takes one engine step; this bounds it.
constexpr int kDrainPolls = 600;
// How long shutdown lets cancelled streams write their last events before closing sockets.
constexpr std::chrono::seconds kShutdownDrain{10};
constexpr const char* kJson = "application/json";

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& code) {
  res.status = status;
  res.set_content(error_body(message, type, code).dump(), kJson);
}

void send_error(httplib::Response& res, const ApiError& e) { send_error(res, e.status(), e.what(), e.type(), e.code()); }

// Equal-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= (unsigned char)(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

std::string completion_id(uint64_t id, bool chat) { return (chat ? "chatcmpl-" : "cmpl-") + std::to_string(id); }

// The error type of a status, for errors httplib raises itself (404, 413, ...).
std::string error_type(int status) {
  if (status == kHttpNotFound) return "not_found_error";
  if (status == kHttpPayloadTooLarge) return "invalid_request_error";
  if (status >= kHttpInternalError) return "server_error";
  return "invalid_request_error";
}

}  // namespace

// One streamed choice: what the content provider has read and sent so far.
struct HttpServer::Stream {
  uint64_t id = 0;
  int index = 0;             // the choice's index
  std::string name;          // the completion's id (every choice's)
  long long created = 0;
  int completion_tokens = 0;
  bool logprobs = false;     // the request asked for log-probabilities
  bool chat = false;         // chat.completion.chunk events
  std::optional<ReasoningStream> reasoning;   // a chat whose reply's reasoning is split off
  std::optional<ToolCallStream> tool_calls;  // a chat whose reply's tool calls are parsed
  bool called_tools = false;                 // its reply held calls: it finishes with "tool_calls"
  size_t text_offset = 0;    // bytes of the completion the engine produced so far (logprobs' text_offset)
  std::string held;  // bytes of a UTF-8 character not yet complete
  bool ended = false;  // the engine's stream was read to its end
  Clock::time_point submitted, first_token;
};

// A streamed request: its choices' streams, read in turn.
struct HttpServer::StreamedChoices {
  std::vector<Stream> streams;
  size_t cursor = 0;         // the stream read next
  bool started = false;      // a chat's role chunks are written
  bool include_usage = false;
  int prompt_tokens = 0;
  bool ended() const {
    return std::all_of(streams.begin(), streams.end(), [](const Stream& s) { return s.ended; });
  }
};

HttpServer::HttpServer(ServerConfig config)
    : config_(std::move(config)),
      http_(std::make_unique<httplib::Server>()),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()) {
  require(config_.http_threads >= 1, "serve: http_threads must be >= 1, got " + std::to_string(config_.http_threads));
  require(config_.port >= 0 && config_.port <= 65535, "--port must be in [0, 65535], got " + std::to_string(config_.port));
  if (!config_.reasoning_parser.empty()) {
    reasoning_ = reasoning_syntax(config_.reasoning_parser);
    require(reasoning_.has_value(), "--reasoning-parser: '" + config_.reasoning_parser + "' is not a parser (" +
                                        reasoning_syntax_names() + ")");
  }
  const size_t threads = size_t(config_.http_threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(config_.max_body_bytes);
  routes();
}

HttpServer::HttpServer(engine::Engine& engine, engine::TextCodec codec, ModelLimits model, ServerConfig config)
    : HttpServer(std::move(config)) {
  attach(engine, std::move(codec), std::move(model));
}

bool HttpServer::attach(engine::Engine& engine, engine::TextCodec codec, ModelLimits model) {
  std::lock_guard<std::mutex> lock(mutex_);
  require(engine_ == nullptr, "HttpServer::attach: an engine is attached already");
  if (shutting_down_) return false;
  engine_ = &engine;
  codec_ = std::move(codec);
  model_ = std::move(model);
  if (config_.request_defaults) model_.defaults = *config_.request_defaults;
  if (!config_.served_model_names.empty()) {
    model_.model_name = config_.served_model_names.front();
    model_.other_names.assign(config_.served_model_names.begin() + 1, config_.served_model_names.end());
  }
  engine.start();
  ready_.store(true, std::memory_order_release);
  return true;
}

HttpServer::~HttpServer() = default;

namespace {

// Pending connections the listening socket queues (the kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 1024;

// cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, compiled into the Debian
// library): a burst of more simultaneous connects than that overflows the accept queue and
// clients see failed reads (16 clients connecting at once lose some). The listening socket is
// not exposed, so find it (listening, bound to `port`) and listen again with a deep queue;
// Linux takes a second listen() as a new backlog.
void widen_listen_backlog(int port) {
  constexpr int kFdsSearched = 4096;  // the server's socket is among the process's first descriptors
  for (int fd = 0; fd < kFdsSearched; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int bound = -1;
    if (addr.ss_family == AF_INET) bound = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) bound = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (bound == port) ::listen(fd, kListenBacklog);
  }
}

}  // namespace

int HttpServer::bind() {
  const int port = config_.port == 0 ? http_->bind_to_any_port(config_.host)
                                     : (http_->bind_to_port(config_.host, config_.port) ? config_.port : -1);
  require(port > 0, "serve: cannot listen on " + config_.host + ":" + std::to_string(config_.port) +
                        " (address in use, or not an address of this machine)");
  widen_listen_backlog(port);
  return port;
}

void HttpServer::run() {
  std::thread watcher([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return stop_requested_; });
    lock.unlock();
    drain_and_stop_listener();
  });
  http_->listen_after_bind();
  shutdown();  // the listener ended on its own (an error): the watcher must still finish
  watcher.join();
  std::unique_lock<std::mutex> lock(mutex_);  // attach() is refused from here on
  engine::Engine* engine = engine_;
  lock.unlock();
  if (engine != nullptr) engine->stop();
}

void HttpServer::shutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  shutting_down_ = true;
  stop_requested_ = true;
  changed_.notify_all();
}

bool HttpServer::shutting_down() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shutting_down_;
}

// Cancels every running request, waits (bounded) until their handlers read the ends and wrote
// their last events, then closes the listener (httplib stops open streams when it closes).
void HttpServer::drain_and_stop_listener() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (uint64_t id : active_) engine_->cancel(id);  // active_ is empty until attach()
  changed_.wait_for(lock, kShutdownDrain, [this] { return active_.empty(); });
  lock.unlock();
  http_->stop();
}

uint64_t HttpServer::admit(const std::vector<int>& prompt, const engine::RequestParams& params) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shutting_down_) throw ApiError(kHttpUnavailable, "server_error", "shutting_down", "the server is shutting down");
  uint64_t id = 0;
  try {
    id = engine_->submit(prompt, params);
  } catch (const Error& e) {  // the engine's checks: pool and context capacity, sampling
    throw bad_request(e.what());
  }
  active_.insert(id);
  return id;
}

void HttpServer::finished(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  active_.erase(id);
  changed_.notify_all();
}

void HttpServer::abandon(uint64_t id) {
  engine_->cancel(id);
  try {
    for (int i = 0; i < kDrainPolls; ++i)
      if (engine_->next(id, kPollInterval).finished != engine::FinishReason::none) break;
  } catch (const Error&) {  // already read to its end
  }
  finished(id);
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (config_.api_key.empty()) return true;
  static constexpr const char* kBearer = "Bearer ";
  const std::string header = req.get_header_value("Authorization");
  if (header.rfind(kBearer, 0) != 0) return false;
  return same_secret(header.substr(std::string(kBearer).size()), config_.api_key);
}

json HttpServer::model_json(const std::string& name) const {
  return json{{"id", name},          {"object", "model"},          {"created", created_},
              {"owned_by", "fp4kv"}, {"max_model_len", model_.context}};
}

namespace {

std::vector<std::string> served_names(const ModelLimits& model) {
  std::vector<std::string> names{model.model_name};
  names.insert(names.end(), model.other_names.begin(), model.other_names.end());
  return names;
}

}  // namespace

void HttpServer::routes() {
  using httplib::Request;
  using httplib::Response;
  using HR = httplib::Server::HandlerResponse;
  http_->set_pre_routing_handler([this](const Request& req, Response& res) {
    const bool api = req.path.rfind("/v1/", 0) == 0 || req.path == kTokenizePath || req.path == kDetokenizePath;
    if (api && !authorized(req)) {
      send_error(res, kHttpUnauthorized, "missing or wrong API key (send `Authorization: Bearer <key>`)",
                 "authentication_error", "invalid_api_key");
      return HR::Handled;
    }
    if (shutting_down()) {
      send_error(res, kHttpUnavailable, "the server is shutting down", "server_error", "shutting_down");
      return HR::Handled;
    }
    if (!ready_.load(std::memory_order_acquire)) {
      send_error(res, kHttpUnavailable, "the model is loading; retry when GET /health answers 200", "server_error",
                 "loading");
      return HR::Handled;
    }
    return HR::Unhandled;
  });
  http_->set_error_handler([](const Request& req, Response& res) {
    if (!res.body.empty()) return;  // a handler's own error body
    const std::string message = res.status == kHttpNotFound ? "no route for " + req.method + " " + req.path
                                : res.status == kHttpPayloadTooLarge
                                    ? "the request body exceeds the limit of " + std::to_string(kMaxBodyBytes) + " bytes"
                                    : "HTTP status " + std::to_string(res.status);
    send_error(res, res.status, message, error_type(res.status), std::to_string(res.status));
  });
  http_->set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_error(res, kHttpInternalError, what, "server_error", "internal_error");
  });
  http_->Get("/health", [](const Request&, Response& res) { res.set_content(R"({"status":"ok"})", kJson); });
  http_->Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(metrics_.render(engine_->counters()), "text/plain; version=0.0.4");
  });
  http_->Get("/v1/models", [this](const Request&, Response& res) {
    json data = json::array();
    for (const std::string& name : served_names(model_)) data.push_back(model_json(name));
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), kJson);
  });
  http_->Get(R"(/v1/models/(.+))", [this](const Request& req, Response& res) {  // OpenAI's retrieve
    const std::vector<std::string> names = served_names(model_);
    const std::string name = req.matches[1];
    if (std::find(names.begin(), names.end(), name) != names.end())
      return res.set_content(model_json(name).dump(), kJson);
    send_error(res, kHttpNotFound,
               "model '" + name + "' is not served here; this server serves '" + model_.model_name + "'",
               "invalid_request_error", "model_not_found");
  });
  http_->Post("/v1/chat/completions", [this](const Request& req, Response& res) { chat_completions(req, res); });
  http_->Post("/v1/completions", [this](const Request& req, Response& res) { completions(req, res); });
  http_->Post(kTokenizePath, [this](const Request& req, Response& res) { tokenize(req, res); });
  http_->Post(kDetokenizePath, [this](const Request& req, Response& res) { detokenize(req, res); });
}

void HttpServer::completions(const httplib::Request& req, httplib::Response& res) {
  try {
    CompletionRequest r = parse_completion_request(req.body, model_);
    std::vector<std::vector<int>> prompts;
    for (const Prompt& p : r.prompts) prompts.push_back(p.is_tokens ? p.tokens : codec_.encode(p.text));
    generate(r, prompts, res);
  } catch (const ApiError& e) {
    metrics_.request_finished(false);
    send_error(res, e);
  }
}

const model::ChatTemplate* HttpServer::chat_template() const {
  return config_.chat_template ? config_.chat_template.get() : model_.chat_template.get();
}

std::string HttpServer::render_chat(const model::ChatInput& conversation) const {
  const model::ChatTemplate* chat = chat_template();
  if (chat == nullptr)
    throw ApiError(kHttpBadRequest, "invalid_request_error", "no_chat_template",
                   "model '" + model_.model_name + "' has no chat template (no chat_template.jinja, none in "
                   "tokenizer_config.json) and the server was started without --chat-template; use POST "
                   "/v1/completions with a prompt");
  try {
    return chat->render(conversation);
  } catch (const model::jinja::RaisedError& e) {
    throw bad_request(std::string("the chat template refuses this conversation: ") + e.what(),
                      "chat_template_refused");
  } catch (const model::jinja::TemplateError& e) {
    throw bad_request(std::string("the chat template cannot render this conversation: ") + e.what(),
                      "chat_template_error");
  }
}

void HttpServer::tokenize(const httplib::Request& req, httplib::Response& res) const {
  try {
    const TokenizeRequest r = parse_tokenize_request(req.body, model_);
    const std::string text = r.chat ? render_chat(r.conversation) : r.prompt;
    const std::vector<int> ids =
        r.add_special_tokens || !codec_.encode_text ? codec_.encode(text) : codec_.encode_text(text);
    res.set_content(tokenize_json(ids, model_.context).dump(), kJson);
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

void HttpServer::detokenize(const httplib::Request& req, httplib::Response& res) const {
  try {
    res.set_content(detokenize_json(codec_.decode(parse_detokenize_request(req.body, model_))).dump(), kJson);
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

void HttpServer::chat_completions(const httplib::Request& req, httplib::Response& res) {
  try {
    ChatRequest r = parse_chat_request(req.body, model_, config_.tool_call_parser == kHermesToolCalls);
    const std::vector<std::vector<int>> prompt = {codec_.encode(render_chat(r.conversation))};
    generate(r.options, prompt, res);
  } catch (const ApiError& e) {
    metrics_.request_finished(false);
    send_error(res, e);
  }
}

// A request without max_tokens: completions OpenAI's 16, chat the rest of the context (vLLM's
// default); either at most the model's max_new_tokens within the rest of the context.
int HttpServer::default_max_tokens(const CompletionRequest& r, size_t prompt_tokens) const {
  const long long rest = (long long)model_.context - (long long)prompt_tokens;
  long long n = !r.chat ? kDefaultMaxTokens : model_.context == INT_MAX ? kDefaultChatMaxTokensUnbounded : rest;
  if (model_.defaults.max_tokens) n = std::min<long long>(*model_.defaults.max_tokens, rest);
  return int(std::max(n, 1LL));
}

void HttpServer::generate(CompletionRequest& r, const std::vector<std::vector<int>>& prompts, httplib::Response& res) {
  if (!r.seeded) r.params.sampling.seed = std::random_device{}();  // request_id 0: the engine's id
  std::vector<engine::RequestParams> params;  // per prompt
  int prompt_tokens = 0;
  for (const std::vector<int>& prompt : prompts) {
    engine::RequestParams& p = params.emplace_back(r.params);
    if (!r.max_tokens_given) p.max_tokens = default_max_tokens(r, prompt.size());
    if ((long long)prompt.size() + p.max_tokens > model_.context)
      throw ApiError(kHttpBadRequest, "invalid_request_error", "context_length_exceeded",
                     "prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                         std::to_string(p.max_tokens) + ") exceeds the model's context of " +
                         std::to_string(model_.context) + " tokens");
    prompt_tokens += int(prompt.size());
  }
  // Completion p * n + i is choice i of prompt p; a seeded request's choices draw apart by
  // their request ids (choice 0 as with n = 1, so each prompt as in a request of its own).
  std::vector<uint64_t> ids;
  try {
    for (size_t p = 0; p < prompts.size(); ++p) {
      for (int i = 0; i < r.n; ++i) {
        engine::RequestParams choice = params[p];
        if (r.seeded) choice.sampling.request_id = kSeededRequestId + uint64_t(i);
        ids.push_back(admit(prompts[p], choice));
      }
    }
  } catch (...) {
    for (uint64_t id : ids) abandon(id);
    throw;
  }
  if (r.stream)
    respond_stream(r, ids, prompt_tokens, res);
  else
    respond_whole(r, ids, prompt_tokens, res);
}

// One choice read to its end.
struct HttpServer::WholeChoice {
  std::vector<int> tokens;
  std::vector<engine::TokenLogprobs> logprobs;
  engine::FinishReason reason = engine::FinishReason::none;
};

HttpServer::WholeChoice HttpServer::read_whole(uint64_t id) {
  const Clock::time_point submitted = Clock::now();
  Clock::time_point first;
  WholeChoice c;
  while (c.reason == engine::FinishReason::none) {
    const engine::StreamChunk chunk = engine_->next(id, kPollInterval);
    if (!chunk.tokens.empty() && c.tokens.empty()) first = Clock::now();
    c.tokens.insert(c.tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
    c.logprobs.insert(c.logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
    c.reason = chunk.finished;
  }
  finished(id);
  if (!c.tokens.empty()) {
    metrics_.observe_ttft(std::chrono::duration<double>(first - submitted).count());
    if (c.tokens.size() > 1) metrics_.observe_tpot(seconds_since(first) / double(c.tokens.size() - 1));
  }
  return c;
}

// The whole object of one choice (its own index; usage the request's).
json HttpServer::whole_choice_json(const CompletionRequest& r, const std::string& name, const WholeChoice& c,
                                   const Usage& usage) const {
  const std::string text = codec_.decode(c.tokens);
  if (!r.chat) {
    const json lp = r.params.logprobs >= 0 ? logprobs_json(c.tokens, c.logprobs, codec_.decode, 0) : json(nullptr);
    return completion_json(name, model_.model_name, created_, text, c.reason, usage, lp);
  }
  const json lp = r.params.logprobs >= 0 ? chat_logprobs_json(c.tokens, c.logprobs, codec_.decode) : json(nullptr);
  const ReasoningSplit split = reasoning_ ? split_reasoning(text, *reasoning_) : ReasoningSplit{"", text};
  const ParsedReply reply = r.parse_tool_calls ? parse_tool_calls(split.content) : ParsedReply{split.content, {}};
  const std::optional<std::string> reasoning = reasoning_ ? std::optional(split.reasoning) : std::nullopt;
  return chat_completion_json(name, model_.model_name, created_, reply, c.reason, usage, lp, reasoning);
}

void HttpServer::respond_whole(const CompletionRequest& r, const std::vector<uint64_t>& ids, int prompt_tokens,
                               httplib::Response& res) {
  std::vector<WholeChoice> choices;
  for (size_t i = 0; i < ids.size(); ++i) {
    try {
      choices.push_back(read_whole(ids[i]));
    } catch (...) {
      for (size_t j = i; j < ids.size(); ++j) abandon(ids[j]);
      throw;
    }
  }
  Usage usage{prompt_tokens, 0};
  for (const WholeChoice& c : choices) {
    if (c.reason == engine::FinishReason::cancelled)
      throw ApiError(kHttpUnavailable, "server_error", "shutting_down",
                     "the server is shutting down; request cancelled");
    usage.completion_tokens += int(c.tokens.size());
  }
  const std::string name = completion_id(ids.front(), r.chat);
  json whole = whole_choice_json(r, name, choices.front(), usage);
  for (size_t i = 1; i < choices.size(); ++i) {
    json choice = whole_choice_json(r, name, choices[i], usage)["choices"][0];
    choice["index"] = i;
    whole["choices"].push_back(std::move(choice));
  }
  res.set_content(whole.dump(), kJson);
  metrics_.request_finished(true);
}

// One event of a stream in its endpoint's form: text (a delta for chat; none: the closing
// chunk), the finish reason, usage, log-probabilities of the chunk's tokens.
json HttpServer::stream_chunk(const Stream& s, const std::optional<std::string>& text, engine::FinishReason finish,
                              const std::optional<Usage>& usage, const engine::StreamChunk* tokens,
                              const std::string& reasoning) const {
  if (!s.chat) {
    const json lp =
        tokens ? logprobs_json(tokens->tokens, tokens->logprobs, codec_.decode, s.text_offset) : json(nullptr);
    return completion_chunk_json(s.name, model_.model_name, s.created, text.value_or(""), finish, usage, lp, s.index);
  }
  const json lp = tokens ? chat_logprobs_json(tokens->tokens, tokens->logprobs, codec_.decode) : json(nullptr);
  json delta = json::object();
  if (!reasoning.empty()) delta["reasoning_content"] = sanitize_utf8(reasoning);
  if (text && (!text->empty() || reasoning.empty())) delta["content"] = sanitize_utf8(*text);
  return chat_chunk_json(s.name, model_.model_name, s.created, delta, finish, usage, lp, s.called_tools, s.index);
}

ReasoningSplit HttpServer::chat_text(Stream& s, const std::string& text, bool last) const {
  ReasoningSplit parts = s.reasoning ? s.reasoning->feed(text) : ReasoningSplit{"", text};
  if (last && s.reasoning) {
    const ReasoningSplit rest = s.reasoning->finish();
    parts.reasoning += rest.reasoning;
    parts.content += rest.content;
  }
  if (s.tool_calls) parts.content = s.tool_calls->feed(parts.content);
  return parts;
}

// At a parsed chat stream's end: the content held back (all of it when the blocks were not
// calls after all) and one delta per call.
std::string HttpServer::tool_call_events(Stream& s) const {
  const ParsedReply rest = s.tool_calls->finish();
  std::string events;
  if (!rest.content.empty())
    events += sse_event(stream_chunk(s, rest.content, engine::FinishReason::none, std::nullopt, nullptr));
  for (size_t i = 0; i < rest.calls.size(); ++i)
    events += sse_event(chat_chunk_json(s.name, model_.model_name, s.created, tool_call_delta(s.name, i, rest.calls[i]),
                                        engine::FinishReason::none, std::nullopt, nullptr, false, s.index));
  s.called_tools = !rest.calls.empty();
  return events;
}

void HttpServer::stream_events(Stream& s, std::string& events) {
  const engine::StreamChunk c = engine_->next(s.id, kPollInterval);
  if (c.timed_out) return;
  if (!c.tokens.empty() && s.completion_tokens == 0) s.first_token = Clock::now();
  s.completion_tokens += int(c.tokens.size());
  const std::string piece = codec_.decode(c.tokens);
  s.held += piece;
  const bool last = c.finished != engine::FinishReason::none;
  s.ended = last;
  const size_t ready = last ? s.held.size() : utf8_complete_prefix(s.held);
  // A chunk with tokens carries their log-probabilities even while its text waits for the
  // rest of a character.
  const bool with_logprobs = s.logprobs && !c.tokens.empty();
  const ReasoningSplit text =
      s.chat ? chat_text(s, s.held.substr(0, ready), last) : ReasoningSplit{"", s.held.substr(0, ready)};
  if (!text.content.empty() || !text.reasoning.empty() || with_logprobs)
    events += sse_event(stream_chunk(s, text.content, engine::FinishReason::none, std::nullopt,
                                     with_logprobs ? &c : nullptr, text.reasoning));
  s.text_offset += piece.size();
  s.held.erase(0, ready);
  if (!last) return;
  if (s.tool_calls) events += tool_call_events(s);
  events += sse_event(stream_chunk(s, std::nullopt, c.finished, std::nullopt, nullptr));
}

bool HttpServer::write_events(StreamedChoices& g, httplib::DataSink& sink) {
  if (g.ended()) {  // everything was written (the provider is not called after done())
    sink.done();
    return true;
  }
  std::string events;
  if (!g.started) {  // each choice's assistant role opens a chat stream (OpenAI's, vLLM's first chunks)
    for (const Stream& s : g.streams)
      if (s.chat)
        events += sse_event(chat_chunk_json(s.name, model_.model_name, s.created,
                                            json{{"role", "assistant"}, {"content", ""}}, engine::FinishReason::none,
                                            std::nullopt, nullptr, false, s.index));
    g.started = true;
  }
  while (g.streams[g.cursor].ended) g.cursor = (g.cursor + 1) % g.streams.size();
  stream_events(g.streams[g.cursor], events);
  g.cursor = (g.cursor + 1) % g.streams.size();
  const bool last = g.ended();
  if (last) {
    if (g.include_usage) {
      Usage usage{g.prompt_tokens, 0};
      for (const Stream& s : g.streams) usage.completion_tokens += s.completion_tokens;
      events += sse_event(stream_chunk(g.streams.front(), std::nullopt, engine::FinishReason::none, usage, nullptr));
    }
    events += kSseDone;
  }
  if (events.empty()) return sink.is_writable();
  if (!sink.write(events.data(), events.size())) return false;
  if (last) sink.done();
  return true;
}

void HttpServer::respond_stream(const CompletionRequest& r, const std::vector<uint64_t>& ids, int prompt_tokens,
                                httplib::Response& res) {
  auto g = std::make_shared<StreamedChoices>();
  g->include_usage = r.include_usage;
  g->prompt_tokens = prompt_tokens;
  for (size_t i = 0; i < ids.size(); ++i) {
    Stream& s = g->streams.emplace_back();
    s.id = ids[i];
    s.index = int(i);
    s.name = completion_id(ids.front(), r.chat);
    s.chat = r.chat;
    if (r.chat && reasoning_) s.reasoning.emplace(*reasoning_);
    if (r.parse_tool_calls) s.tool_calls.emplace();
    s.created = created_;
    s.logprobs = r.params.logprobs >= 0;
    s.submitted = Clock::now();
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, g](size_t, httplib::DataSink& sink) {
        try {
          return write_events(*g, sink);
        } catch (const std::exception&) {  // never let an exception out of httplib's writer
          return false;
        }
      },
      [this, g](bool success) { stream_closed(*g, success); });
}

void HttpServer::stream_closed(StreamedChoices& g, bool success) {
  const bool ended = g.ended();
  if (!ended) metrics_.client_disconnected();  // the client left (or the listener closed)
  for (const Stream& s : g.streams) {
    if (!s.ended) {  // free the request's blocks
      abandon(s.id);
      continue;
    }
    finished(s.id);
    if (s.completion_tokens > 0) {
      metrics_.observe_ttft(std::chrono::duration<double>(s.first_token - s.submitted).count());
      if (s.completion_tokens > 1) metrics_.observe_tpot(seconds_since(s.first_token) / (s.completion_tokens - 1));
    }
  }
  metrics_.request_finished(ended && success);
}

}  // namespace fp4kv::serve
