// `fp4kv serve`: an OpenAI-compatible HTTP server over the engine. Every completion goes
// through Engine::submit and is read back with Engine::next; the engine's background worker
// steps the continuous batch, so all clients share it. Endpoints: POST /v1/completions and
// POST /v1/chat/completions (JSON or server-sent events; a chat's messages become the prompt
// through the chat template: the operator's --chat-template, else the checkpoint's; without
// one it answers 400 no_chat_template), GET /v1/models (and /v1/models/{id}), GET /health,
// GET /metrics, and vLLM's POST /tokenize (a prompt or a rendered chat to ids) and POST
// /detokenize.
//
// Invariants: every request the server submitted is either read to its end or cancelled and
// drained (a client that leaves mid-stream cancels its request, so its blocks are freed);
// errors are JSON {"error": {"message", "type", "code"}}; nothing a client sends reaches the
// engine unchecked (openai_api.h), and an exception in a handler is a 500, never a crash.
// shutdown() (any thread): new requests get 503, running ones are cancelled (their streams
// end with finish_reason "cancelled"), the listener closes, run() returns after the worker
// stopped. A server may listen before its model is loaded (constructed without an engine):
// every request gets 503 with code "loading" until attach() hands it the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fp4kv/engine/engine.h"
#include "fp4kv/serve/metrics.h"
#include "fp4kv/serve/openai_api.h"
#include "fp4kv/serve/reasoning.h"

namespace httplib {
class Server;
struct Request;
struct Response;
class DataSink;
}  // namespace httplib

namespace fp4kv::serve {

// Request bodies above this are refused with 413 (a prompt of a whole context is far smaller).
inline constexpr size_t kMaxBodyBytes = size_t(1) << 20;
// vLLM's tokenizer endpoints (outside /v1, guarded by the API key as /v1 is).
inline constexpr const char* kTokenizePath = "/tokenize";
inline constexpr const char* kDetokenizePath = "/detokenize";
// The tool-call parser of --tool-call-parser (tool_calls.h).
inline constexpr const char* kHermesToolCalls = "hermes";

struct ServerConfig {
  std::string host = "127.0.0.1";  // loopback unless the operator says otherwise
  int port = 8000;                 // 0: the OS picks a free port (bind() returns it)
  std::string api_key;             // non-empty: /v1/* need `Authorization: Bearer <key>`
  size_t max_body_bytes = kMaxBodyBytes;
  int http_threads = 16;           // connections served at once (a stream holds one)
  // Renders chat completions instead of the checkpoint's own template (null: the checkpoint's).
  std::shared_ptr<const model::ChatTemplate> chat_template;
  // "hermes": chat replies' <tool_call> blocks become tool_calls (tools with tool_choice
  // "auto" are served); empty: tools only with tool_choice "none".
  std::string tool_call_parser;
  // "qwen3" or "deepseek_r1" (reasoning.h): chat replies' <think> block becomes
  // reasoning_content; empty: the whole reply is content.
  std::string reasoning_parser;
  // What requests get for sampling fields they leave out, instead of the checkpoint's
  // generation_config.json (null: the checkpoint's, ModelLimits::defaults).
  std::optional<RequestDefaults> request_defaults;
  // The model's ids in the API (the first in responses; requests may name any), instead of
  // the checkpoint directory's name (empty: that name).
  std::vector<std::string> served_model_names;
};

class HttpServer {
 public:
  // A server with no model yet: it binds and runs, answering 503 "loading", until attach().
  explicit HttpServer(ServerConfig config);
  // A server over `engine` from the start (the constructor above, then attach()).
  HttpServer(engine::Engine& engine, engine::TextCodec codec, ModelLimits model, ServerConfig config);
  ~HttpServer();

  // Serves `engine` from now on and starts its worker (run() stops it); `engine` must outlive
  // the server. Thread-safe. Returns false, attaching nothing, once shutdown() was called;
  // throws fp4kv::Error when an engine is attached already.
  bool attach(engine::Engine& engine, engine::TextCodec codec, ModelLimits model);

  // Binds host:port; returns the port bound. Throws Error when it cannot.
  int bind();
  // Serves until shutdown(); starts the engine's worker first and stops it last.
  void run();
  // Thread-safe and idempotent; returns at once (run() finishes the work).
  void shutdown();
  bool shutting_down() const;

  const ServerMetrics& metrics() const { return metrics_; }

 private:
  struct Stream;
  void routes();
  void completions(const httplib::Request& req, httplib::Response& res);
  void chat_completions(const httplib::Request& req, httplib::Response& res);
  // A model object of GET /v1/models (and /v1/models/{name}).
  nlohmann::json model_json(const std::string& name) const;
  void tokenize(const httplib::Request& req, httplib::Response& res) const;
  void detokenize(const httplib::Request& req, httplib::Response& res) const;
  // The prompt text of a conversation through the chat template in force. Throws ApiError
  // (no template, a template's refusal or failure).
  std::string render_chat(const model::ChatInput& conversation) const;
  // Submits every prompt n times for `r` and answers with the whole completions or their
  // streams. Throws ApiError (before submitting any when a prompt does not fit the context).
  void generate(CompletionRequest& r, const std::vector<std::vector<int>>& prompts, httplib::Response& res);
  int default_max_tokens(const CompletionRequest& r, size_t prompt_tokens) const;
  // The chat template in force, or null.
  const model::ChatTemplate* chat_template() const;
  struct WholeChoice;
  struct StreamedChoices;
  // Reads choice `id` to its end and forgets it (metrics observed).
  WholeChoice read_whole(uint64_t id);
  nlohmann::json whole_choice_json(const CompletionRequest& r, const std::string& name, const WholeChoice& c,
                                   const Usage& usage) const;
  // The answer to a request of the choices `ids` (one engine request each, submitted).
  void respond_whole(const CompletionRequest& r, const std::vector<uint64_t>& ids, int prompt_tokens,
                     httplib::Response& res);
  void respond_stream(const CompletionRequest& r, const std::vector<uint64_t>& ids, int prompt_tokens,
                      httplib::Response& res);
  nlohmann::json stream_chunk(const Stream& s, const std::optional<std::string>& text, engine::FinishReason finish,
                              const std::optional<Usage>& usage, const engine::StreamChunk* tokens,
                              const std::string& reasoning = "") const;
  // A chat stream's text split into reasoning and content by the reasoning parser and the
  // content's tool calls held back (`last`: the reply's end, what the parsers held released).
  ReasoningSplit chat_text(Stream& s, const std::string& text, bool last) const;
  std::string tool_call_events(Stream& s) const;
  // Reads choice s's next engine chunk (waiting at most the poll interval) into events: its
  // deltas and, at its end, the held-back text, the tool calls and the finish chunk.
  void stream_events(Stream& s, std::string& events);
  // Reads the next choice in turn and writes its events (after the last choice's end the usage
  // chunk and [DONE]); false when the client is gone.
  bool write_events(StreamedChoices& g, httplib::DataSink& sink);
  // A stream's end, read through or not: unfinished choices cancelled, metrics observed.
  void stream_closed(StreamedChoices& g, bool success);
  // Submits under the shutdown lock (a request submitted while shutting down is refused, so
  // shutdown's cancel sweep sees every running request). Throws ApiError.
  uint64_t admit(const std::vector<int>& prompt, const engine::RequestParams& params);
  // Cancels `id` and reads its stream to the end (bounded), then forgets it.
  void abandon(uint64_t id);
  void finished(uint64_t id);
  bool authorized(const httplib::Request& req) const;
  void drain_and_stop_listener();

  // Set once by attach() before ready_ turns true; a handler reads them only after it saw
  // ready_ (acquire), so they need no lock.
  engine::Engine* engine_ = nullptr;
  engine::TextCodec codec_;
  ModelLimits model_;
  std::atomic<bool> ready_{false};
  ServerConfig config_;
  std::optional<ReasoningSyntax> reasoning_;  // config_.reasoning_parser's
  std::unique_ptr<httplib::Server> http_;
  ServerMetrics metrics_;
  long long created_;  // Unix time of start, the `created` of /v1/models

  mutable std::mutex mutex_;  // guards the three below
  std::condition_variable changed_;
  std::set<uint64_t> active_;  // submitted, not yet read to the end
  bool shutting_down_ = false;
  bool stop_requested_ = false;
};

}  // namespace fp4kv::serve
