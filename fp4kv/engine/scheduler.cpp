#include "fp4kv/engine/scheduler.h"

#include <algorithm>
#include <string>
#include <utility>

#include "fp4kv/core/error.h"
#include "fp4kv/ref/sampling.h"

namespace fp4kv::engine {

struct Scheduler::Sequence {
  uint64_t id = 0;
  RequestSpec spec;
  std::vector<int> generated;
  std::vector<TokenLogprobs> generated_logprobs;  // per generated token, when asked for
  std::string text;               // detokenized generated tokens
  std::vector<size_t> text_ends;  // per generated token: text.size() after it
  int fed = 0;                    // tokens whose K/V the backend state holds
  size_t emitted = 0;             // generated tokens already emitted
  bool admitted_once = false;
  FinishReason finish = FinishReason::none;

  int length() const { return int(spec.prompt.size() + generated.size()); }
  int left() const { return length() - fed; }
  int token_at(int i) const {
    const int p = int(spec.prompt.size());
    return i < p ? spec.prompt[size_t(i)] : generated[size_t(i - p)];
  }
  bool decoding() const { return fed > 0 && left() == 1; }
};

struct Scheduler::Plan {
  int budget = 0;
  std::vector<Sequence*> decode;
  std::vector<std::pair<Sequence*, int>> chunks;  // request, tokens to feed
};

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::eos: return "eos";
    case FinishReason::length: return "length";
    case FinishReason::stop: return "stop";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

Scheduler::Scheduler(Backend& backend, const SchedulerConfig& config, Detokenize detokenize)
    : backend_(backend), config_(config), detokenize_(std::move(detokenize)), blocks_(config.total_blocks) {
  require(config.max_batch >= 1, "Scheduler: max_batch must be >= 1, got " + std::to_string(config.max_batch));
  require(config.max_step_tokens >= config.max_batch,
          "Scheduler: max_step_tokens (" + std::to_string(config.max_step_tokens) +
              ") must be >= max_batch (" + std::to_string(config.max_batch) + ") so every decode fits a step");
  require(config.prefill_chunk >= 1,
          "Scheduler: prefill_chunk must be >= 1, got " + std::to_string(config.prefill_chunk));
  require(bool(detokenize_), "Scheduler: no detokenizer");
}

Scheduler::~Scheduler() = default;

void Scheduler::validate(const RequestSpec& spec) const {
  require(!spec.prompt.empty(), "submit: the prompt is empty");
  require(spec.max_tokens >= 1, "submit: max_tokens must be >= 1, got " + std::to_string(spec.max_tokens));
  require(spec.logprobs >= -1 && spec.logprobs <= kMaxTopLogprobs,
          "submit: logprobs must be -1 (none) or 0.." + std::to_string(kMaxTopLogprobs) + ", got " +
              std::to_string(spec.logprobs));
  ref::check_sampling(spec.sampling);
  const int vocab = backend_.vocab_size();
  for (int t : spec.prompt)
    require(t >= 0 && t < vocab, "submit: prompt token " + std::to_string(t) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab) + ")");
  for (const std::string& s : spec.stop) require(!s.empty(), "submit: an empty stop string");
  for (int t : spec.stop_token_ids)
    require(t >= 0 && t < vocab, "submit: stop token " + std::to_string(t) + " is outside the vocabulary [0, " +
                                     std::to_string(vocab) + ")");
  // The last token drawn is never fed, so a request alone needs K/V for prompt + max_tokens - 1.
  const long long most_fed = (long long)spec.prompt.size() + spec.max_tokens - 1;
  require(blocks_for_tokens(most_fed) <= blocks_.total(),
          "submit: a " + std::to_string(spec.prompt.size()) + "-token prompt with max_tokens " +
              std::to_string(spec.max_tokens) + " needs " + std::to_string(blocks_for_tokens(most_fed)) +
              " cache blocks; the pool has " + std::to_string(blocks_.total()));
  const int context = backend_.max_positions();
  if (context > 0)
    require((long long)spec.prompt.size() + spec.max_tokens <= context,
            "submit: a " + std::to_string(spec.prompt.size()) + "-token prompt with max_tokens " +
                std::to_string(spec.max_tokens) + " goes beyond the model's context of " + std::to_string(context));
}

void Scheduler::add(uint64_t id, RequestSpec spec) {
  validate(spec);
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->spec = std::move(spec);
  waiting_.push_back(std::move(s));
}

bool Scheduler::cancel(uint64_t id) {
  const auto match = [id](const std::unique_ptr<Sequence>& s) { return s->id == id; };
  const bool known = std::any_of(waiting_.begin(), waiting_.end(), match) ||
                     std::any_of(running_.begin(), running_.end(), match);
  if (known) cancels_.push_back(id);
  return known;
}

bool Scheduler::idle() const { return waiting_.empty() && running_.empty(); }

SchedulerCounters Scheduler::counters() const {
  SchedulerCounters c = counters_;
  c.running = int(running_.size());
  c.waiting = int(waiting_.size());
  c.blocks_used = blocks_.used_count();
  c.blocks_free = blocks_.free_count();
  return c;
}

void Scheduler::preempt_newest() {
  std::unique_ptr<Sequence> s = std::move(running_.back());
  running_.pop_back();
  if (blocks_.held(s->id) > 0) blocks_.release(s->id);
  backend_.drop(s->id);
  s->fed = 0;
  waiting_.push_front(std::move(s));
  ++counters_.preemptions;
}

void Scheduler::plan_decodes(Plan& plan) {
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence* s = running_[i].get();
    if (!s->decoding()) continue;
    while (!blocks_.fits(s->id, s->fed + 1) && running_.back().get() != s) preempt_newest();
    if (!blocks_.fits(s->id, s->fed + 1)) {  // s is the newest: it waits for the others
      preempt_newest();
      return;
    }
    blocks_.reserve(s->id, s->fed + 1);
    plan.decode.push_back(s);
    --plan.budget;
  }
}

void Scheduler::plan_prefills(Plan& plan) {
  for (const auto& ptr : running_) {
    Sequence* s = ptr.get();
    if (s->decoding() || plan.budget == 0) continue;
    const int n = std::min({s->left(), config_.prefill_chunk, plan.budget});
    plan.chunks.emplace_back(s, n);
    plan.budget -= n;
  }
}

void Scheduler::admit(Plan& plan) {
  while (!waiting_.empty() && plan.budget > 0 && int(running_.size()) < config_.max_batch) {
    Sequence* s = waiting_.front().get();
    if (!blocks_.fits(s->id, s->length())) return;  // FIFO: nobody overtakes the front
    blocks_.reserve(s->id, s->length());
    if (!s->admitted_once) counters_.prompt_tokens += (long long)s->spec.prompt.size();
    s->admitted_once = true;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    const int n = std::min({s->left(), config_.prefill_chunk, plan.budget});
    plan.chunks.emplace_back(s, n);
    plan.budget -= n;
  }
}

// Emits the generated tokens whose text ends at or before `limit` characters.
// Emits the generated tokens (and their log-probabilities) whose text ends at or before `limit`.
static void emit_until(const std::vector<int>& generated, const std::vector<TokenLogprobs>& logprobs,
                       const std::vector<size_t>& ends, size_t limit, size_t& emitted, Emitted& e) {
  while (emitted < generated.size() && ends[emitted] <= limit) {
    if (!logprobs.empty()) e.logprobs.push_back(logprobs[emitted]);
    e.tokens.push_back(generated[emitted++]);
  }
}

size_t partial_match_at_end(const std::string& text, const std::vector<std::string>& needles) {
  size_t held = 0;
  for (const std::string& s : needles) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > held; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        held = k;
        break;
      }
    }
  }
  return held;
}

// Where the first stop string starts in `text`, searching from `from`; npos when none.
static size_t first_stop(const std::string& text, const std::vector<std::string>& stops, size_t from) {
  size_t best = std::string::npos;
  for (const std::string& s : stops) best = std::min(best, text.find(s, from));
  return best;
}

DrawSpec Scheduler::next_draw(const Sequence& s) {
  DrawSpec d;
  d.sampling = s.spec.sampling;
  d.sampling.step = uint64_t(s.generated.size());
  d.logprobs = s.spec.logprobs;
  return d;
}

void Scheduler::take(Sequence& s, const TokenDraw& drawn, std::vector<Emitted>& out) {
  const int token = drawn.token;
  const size_t text_before = s.text.size();
  s.generated.push_back(token);
  if (s.spec.logprobs >= 0) s.generated_logprobs.push_back(drawn.logprobs.value_or(TokenLogprobs{}));
  s.text = detokenize_(s.generated);
  s.text_ends.push_back(s.text.size());
  ++counters_.generated_tokens;

  Emitted e;
  e.id = s.id;
  size_t longest_stop = 0;
  for (const std::string& st : s.spec.stop) longest_stop = std::max(longest_stop, st.size());
  const size_t from = text_before >= longest_stop ? text_before - longest_stop + 1 : 0;
  const size_t stop_at = s.spec.stop.empty() ? std::string::npos : first_stop(s.text, s.spec.stop, from);
  bool whole_text = true;  // the text up to the token emitted (a stop string ends it before)
  if (stop_at != std::string::npos) {
    s.finish = FinishReason::stop;
    whole_text = false;
    emit_until(s.generated, s.generated_logprobs, s.text_ends, stop_at, s.emitted, e);
  } else if (s.spec.stop_at_eos && backend_.is_eos(token)) {
    s.finish = FinishReason::eos;
  } else if (std::find(s.spec.stop_token_ids.begin(), s.spec.stop_token_ids.end(), token) !=
             s.spec.stop_token_ids.end()) {
    s.finish = FinishReason::stop;
  } else if (int(s.generated.size()) >= s.spec.max_tokens) {
    s.finish = FinishReason::length;
  }
  if (s.finish == FinishReason::none) {
    const size_t held = partial_match_at_end(s.text, s.spec.stop);
    emit_until(s.generated, s.generated_logprobs, s.text_ends, s.text.size() - held, s.emitted, e);
  } else if (whole_text) {
    emit_until(s.generated, s.generated_logprobs, s.text_ends, s.text.size(), s.emitted, e);
  }
  e.finished = s.finish;
  if (!e.tokens.empty() || e.finished != FinishReason::none) out.push_back(std::move(e));
}

void Scheduler::execute(const Plan& plan, std::vector<Emitted>& out) {
  if (!plan.decode.empty()) {
    std::vector<uint64_t> ids;
    std::vector<int> tokens;
    std::vector<DrawSpec> draws;
    for (const Sequence* s : plan.decode) {
      ids.push_back(s->id);
      tokens.push_back(s->token_at(s->fed));
      draws.push_back(next_draw(*s));
    }
    const std::vector<TokenDraw> drawn = backend_.decode_and_draw(ids, tokens, draws);
    for (size_t i = 0; i < plan.decode.size(); ++i) {
      ++plan.decode[i]->fed;
      take(*plan.decode[i], drawn[i], out);
    }
    counters_.fed_tokens += (long long)plan.decode.size();
  }
  for (const auto& [s, n] : plan.chunks) {
    std::vector<int> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(s->token_at(s->fed + i));
    const bool last = s->left() == n;  // the chunk ends the tokens to feed: draw the next one
    TokenDraw drawn;
    if (last) {
      drawn = backend_.prefill_and_draw(s->id, tokens, next_draw(*s));
    } else {
      backend_.prefill(s->id, tokens);
    }
    s->fed += n;
    counters_.fed_tokens += n;
    if (last) take(*s, drawn, out);
  }
}

void Scheduler::retire(Sequence& s, FinishReason reason, std::vector<Emitted>& out) {
  if (blocks_.held(s.id) > 0) blocks_.release(s.id);
  backend_.drop(s.id);
  ++counters_.finished;
  if (reason == FinishReason::cancelled) {
    Emitted e;
    e.id = s.id;
    e.finished = reason;
    out.push_back(std::move(e));
  }
}

std::vector<Emitted> Scheduler::step() {
  std::vector<Emitted> out;
  for (uint64_t id : cancels_) {
    const auto match = [id](const std::unique_ptr<Sequence>& s) { return s->id == id; };
    if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
      retire(**it, FinishReason::cancelled, out);
      running_.erase(it);
    } else if (auto w = std::find_if(waiting_.begin(), waiting_.end(), match); w != waiting_.end()) {
      retire(**w, FinishReason::cancelled, out);
      waiting_.erase(w);
    }
  }
  cancels_.clear();

  Plan plan;
  plan.budget = config_.max_step_tokens;
  plan_decodes(plan);
  plan_prefills(plan);
  admit(plan);
  execute(plan, out);

  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->finish != FinishReason::none) {
      retire(**it, (*it)->finish, out);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  ++counters_.steps;
  return out;
}

}  // namespace fp4kv::engine
