#include "fp4kv/eval/evaluate.h"
#include "fp4kv/eval/recipe_setup.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "fp4kv/core/error.h"
#include "fp4kv/core/input_file.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/eval/kl.h"
#include "fp4kv/eval/limits.h"
#include "fp4kv/eval/model_attention.h"
#include "fp4kv/eval/retrieval.h"
#include "fp4kv/model/byte_tokenizer.h"
#include "fp4kv/model/qwen3.h"

namespace fp4kv::eval {

namespace fs = std::filesystem;

namespace {
// The text is held once and its windows are copied and tokenized (4 bytes per byte).
constexpr double kTextBytesPerFileByte = 2.0;
}  // namespace

std::string read_text_file(const std::string& path, const std::string& option) {
  std::error_code ec;
  require(fs::exists(path, ec), option + ": cannot read text file '" + path + "': it does not exist");
  require_regular_file(path, option);
  const uint64_t size = fs::file_size(path, ec);
  require_fits_memory(kTextBytesPerFileByte * double(size), available_memory_bytes(), option,
                      "reading the " + std::to_string(size) + "-byte text '" + path + "'");
  const std::optional<std::string> s = read_file(path);
  require(s.has_value(), option + ": cannot read text file '" + path + "'");
  require(!s->empty(), option + ": text file '" + path + "' is empty");
  return *s;
}

void check_eval_limits(const EvalOptions& o, const model::Qwen3Config& cfg) {
  require(o.context > 2 * kPageTokens - 1, "--context must be at least 256 tokens (the first page is not scored)");
  require(o.windows >= 1, "--windows must be at least 1");
  require(o.retrieval_docs >= 0, "--retrieval-docs must be >= 0");
  require_within_positions(cfg, o.context, "--context");
  const uint64_t available = available_memory_bytes();
  // The reference logits stay alive while each recipe's logits are computed.
  require_fits_memory(forward_pass_bytes(cfg, o.context, {.logits_copies = 2}), available, "--context",
                      "a window of " + std::to_string(o.context) + " tokens");
  if (o.retrieval_docs == 0) return;
  require_within_positions(cfg, o.retrieval_context, "--retrieval-context");
  // The document's K/V state, and its copy joined with each question.
  const double doc = forward_pass_bytes(cfg, o.retrieval_context, {.logits_copies = 1, .kv_states = 2});
  const double bodies = double(o.retrieval_docs) * o.retrieval_context * sizeof(int);
  require_fits_memory(doc, available, "--retrieval-context",
                      "a pass-key document of " + std::to_string(o.retrieval_context) + " tokens");
  require_fits_memory(doc + bodies, available, "--retrieval-docs",
                      std::to_string(o.retrieval_docs) + " pass-key documents");
}

namespace {

class Progress {
 public:
  Progress(bool on, long total) : on_(on), total_(total), t0_(std::chrono::steady_clock::now()) {}
  void step(const std::string& what) {
    ++done_;
    if (!on_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    std::fprintf(stderr, "\r[fp4kv eval] %ld/%ld forward passes, %.0f s, %-40.40s", done_, total_, s, what.c_str());
    if (done_ == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool on_;
  long total_, done_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

Calibration obtain_calibration(const EvalOptions& o, const model::Qwen3Model& m, std::string& note, std::ostream& log) {
  if (!o.calibration_path.empty()) {
    note = o.calibration_path + " (given)";
    return Calibration::load(o.calibration_path, m.config(), m.key_norm_bounds());
  }
  const fs::path beside = fs::path(o.model_dir) / kCalibrationFile;
  if (fs::exists(beside)) {
    note = beside.string() + " (saved beside the model)";
    return Calibration::load(beside.string(), m.config(), m.key_norm_bounds());
  }
  log << "no calibration file given or beside the model: calibrating first (fp4kv calibrate)\n";
  CalibrationOptions co;
  co.calib_text = read_text_file(o.calib_text_path, "--calibration-text");
  co.context = std::max(o.context, 2 * kPageTokens);
  Calibration c = calibrate(m, fs::path(o.model_dir).filename().string(), co);
  try {
    c.save(beside.string());
    note = beside.string() + " (computed now in " + std::to_string(int(c.seconds)) + " s and saved)";
  } catch (const Error&) {
    note = "computed now in " + std::to_string(int(c.seconds)) + " s (model directory not writable)";
  }
  return c;
}

std::string fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

}  // namespace

struct RetrievalScore {
  int correct = 0, asked = 0;
};

// Every question extends the document prefix computed once.
RetrievalScore retrieval_on_cpu(const model::Qwen3Model& m, const model::AttentionFn& attend,
                                 const std::vector<PasskeyDoc>& docs, int vocab) {
  RetrievalScore r;
  for (const PasskeyDoc& doc : docs) {
    model::KvState body;
    m.forward(doc.body, attend, nullptr, &body);
    for (const PasskeyQuestion& q : doc.questions) {
      r.correct += passkey_correct(m.extend(body, q.tokens, attend), vocab, q);
      ++r.asked;
    }
  }
  return r;
}

// Every question as one sequence (document + question), all of them at once.
RetrievalScore retrieval_through(const ForcedLogitsFn& forced, const Recipe& recipe, const Calibration* cal,
                                 const std::vector<PasskeyDoc>& docs, int vocab) {
  std::vector<std::vector<int>> seqs;
  std::vector<const PasskeyQuestion*> questions;
  std::vector<size_t> body_len;
  for (const PasskeyDoc& doc : docs)
    for (const PasskeyQuestion& q : doc.questions) {
      std::vector<int> s = doc.body;
      s.insert(s.end(), q.tokens.begin(), q.tokens.end());
      seqs.push_back(std::move(s));
      questions.push_back(&q);
      body_len.push_back(doc.body.size());
    }
  const std::vector<std::vector<float>> logits = forced(recipe, cal, seqs);
  RetrievalScore r;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::vector<float> q_logits(logits[i].begin() + body_len[i] * vocab, logits[i].end());
    r.correct += passkey_correct(q_logits, vocab, *questions[i]);
    ++r.asked;
  }
  return r;
}

EvalReport evaluate(const EvalOptions& o, std::ostream& log) {
  const auto t0 = std::chrono::steady_clock::now();
  require(fs::exists(o.model_dir), "--model: model directory '" + o.model_dir + "' does not exist");
  require(fs::is_directory(o.model_dir), "--model: '" + o.model_dir + "' is not a directory");
  require(!o.configs.empty(), "no configurations to evaluate");
  const model::Qwen3Config config = model::Qwen3Config::load_dir(o.model_dir);
  check_eval_limits(o, config);
  // The windows and pass-key documents are byte tokens: another vocabulary would read them
  // as unrelated ids and report numbers about nothing.
  model::require_byte_tokenizer(config, o.model_dir);
  if (!o.calibration_path.empty()) require_regular_file(o.calibration_path, "--calibration");
  const std::string text = read_text_file(o.text_path, "--text");
  require(text.size() + 1 >= size_t(o.context),
          "text '" + o.text_path + "' (" + std::to_string(text.size()) + " bytes) is shorter than the context of " +
              std::to_string(o.context) + " tokens");
  // Windows start at distinct byte offsets; more than the text holds would repeat them.
  const size_t distinct_windows = text.size() + 2 - size_t(o.context);
  require(size_t(o.windows) <= distinct_windows,
          "--windows " + std::to_string(o.windows) + " exceeds the " + std::to_string(distinct_windows) +
              " distinct windows of " + std::to_string(o.context) + " tokens that '" + o.text_path + "' holds");
  const model::Qwen3Model m = model::Qwen3Model::load(o.model_dir);
  const model::Qwen3Config& cfg = m.config();

  EvalReport rep;
  rep.model = fs::path(o.model_dir).filename().string();
  if (rep.model.empty()) rep.model = fs::path(o.model_dir).parent_path().filename().string();
  rep.context = o.context;
  rep.windows = o.windows;
  rep.retrieval_docs = o.retrieval_docs;
  rep.retrieval_context = o.retrieval_context;
  rep.reference = o.reference;
  rep.baseline = o.baseline;
  rep.text = o.text_path;
  rep.device = o.device;

  std::vector<Recipe> configs = o.configs;
  const Recipe reference = parse_recipe(o.reference);
  bool has_baseline = false;
  for (const auto& r : configs) has_baseline |= r.name == o.baseline;
  if (!has_baseline) configs.push_back(parse_recipe(o.baseline));

  std::optional<Calibration> calib;
  for (const auto& r : configs)
    if (recipe_needs_calibration(r) && !calib) calib = obtain_calibration(o, m, rep.calibration, log);
  if (!calib) rep.calibration = "none needed";
  for (auto& r : configs)
    if (calib && r.prob == ProbFormat::fp4_underflow) r.tau = calib->tau;
  const Calibration* cal = calib ? &*calib : nullptr;

  const int vocab = cfg.vocab_size, bos = cfg.bos_token_id >= 0 ? cfg.bos_token_id : model::kByteBos;
  const long kl_steps = (o.forced_logits ? 1 : long(o.windows)) * (1 + long(configs.size()));
  Progress progress(o.progress, kl_steps + long(o.retrieval_docs) * long(configs.size()));

  // Teacher-forced KL on W windows of the held-out text.
  std::mt19937 rng(o.seed);
  std::vector<std::vector<int>> windows;
  for (int w = 0; w < o.windows; ++w) {
    const size_t span = size_t(o.context - 1);
    const size_t off = text.size() > span ? size_t(rng() % (text.size() - span + 1)) : 0;
    std::vector<int> tokens = model::encode_bytes(std::string_view(text).substr(off, span), false);
    tokens.insert(tokens.begin(), bos);
    windows.push_back(std::move(tokens));
  }
  std::vector<ConfigResult> res(configs.size());
  std::vector<double> top1_sum(configs.size(), 0.0);
  auto score = [&](size_t c, const std::vector<float>& ref_logits, const std::vector<float>& logits, int L) {
    const KlStats st = teacher_forced_kl(ref_logits, logits, L, vocab, kPageTokens);
    res[c].window_kl.push_back(st.kl);
    top1_sum[c] += st.top1_mismatch;
  };
  if (o.forced_logits) {  // every window of a recipe at once
    const std::vector<std::vector<float>> ref_logits = o.forced_logits(reference, cal, windows);
    progress.step(reference.name + " (" + std::to_string(o.windows) + " windows)");
    for (size_t c = 0; c < configs.size(); ++c) {
      const std::vector<std::vector<float>> logits =
          configs[c].name == reference.name ? ref_logits : o.forced_logits(configs[c], cal, windows);
      for (int w = 0; w < o.windows; ++w) score(c, ref_logits[w], logits[w], int(windows[w].size()));
      progress.step(configs[c].name + " (" + std::to_string(o.windows) + " windows)");
    }
  } else {
    for (int w = 0; w < o.windows; ++w) {
      const std::vector<int>& tokens = windows[w];
      const std::vector<float> ref_logits = m.forward(tokens, recipe_attention(cfg, reference, cal));
      progress.step("window " + std::to_string(w + 1) + " " + reference.name);
      for (size_t c = 0; c < configs.size(); ++c) {
        const std::vector<float> logits =
            configs[c].name == reference.name ? ref_logits : m.forward(tokens, recipe_attention(cfg, configs[c], cal));
        score(c, ref_logits, logits, int(tokens.size()));
        progress.step("window " + std::to_string(w + 1) + " " + configs[c].name);
      }
    }
  }
  size_t base_index = 0;
  for (size_t c = 0; c < configs.size(); ++c)
    if (configs[c].name == o.baseline) base_index = c;
  for (size_t c = 0; c < configs.size(); ++c) {
    double sum = 0;
    for (double x : res[c].window_kl) sum += x;
    res[c].name = configs[c].name;
    res[c].kl_1e3 = 1e3 * sum / o.windows;
    res[c].top1_mismatch_pct = 100.0 * top1_sum[c] / o.windows;
    res[c].t_vs_baseline = paired_t(res[c].window_kl, res[base_index].window_kl);
  }

  // Pass-key retrieval: every needle of every document, each question extending the
  // document prefix computed once per recipe.
  if (o.retrieval_docs > 0) {
    const std::vector<std::string> words = passkey_words(text);
    std::mt19937 drng(o.seed + 7919);
    std::vector<PasskeyDoc> docs;
    for (int i = 0; i < o.retrieval_docs; ++i) docs.push_back(make_passkey_doc(text, words, o.retrieval_context, drng));
    for (size_t c = 0; c < configs.size(); ++c) {
      const RetrievalScore r = o.forced_logits ? retrieval_through(o.forced_logits, configs[c], cal, docs, vocab)
                                               : retrieval_on_cpu(m, recipe_attention(cfg, configs[c], cal), docs, vocab);
      for (size_t d = 0; d < docs.size(); ++d) progress.step("retrieval " + configs[c].name);
      res[c].retrieval_acc = double(r.correct) / double(r.asked);
      res[c].retrieval_questions = r.asked;
    }
  }
  rep.configs = std::move(res);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

std::string EvalReport::table() const {
  std::ostringstream s;
  s << "fp4kv eval (" << device << "): " << model << ", " << windows << " windows x " << context << " tokens of " << text
    << "; reference " << reference << ", t against " << baseline << "\n";
  s << "calibration: " << calibration << "\n";
  if (retrieval_docs > 0)
    s << "retrieval: " << retrieval_docs << " pass-key documents of " << retrieval_context
      << " tokens, every needle asked (" << (configs.empty() ? 0 : configs[0].retrieval_questions) << " questions)\n";
  char line[256];
  std::snprintf(line, sizeof line, "\n%-34s %12s %10s %10s %10s\n", "config", "KL (1e-3)", "top-1 %", "t", "retrieval");
  s << line;
  for (const auto& c : configs) {
    const double tv = c.t_vs_baseline;
    const std::string t = c.name == baseline   ? "-"
                          : std::isfinite(tv) ? fmt("%.2f", tv)
                          : std::isnan(tv)    ? "n/a"  // one window
                                              : (tv > 0 ? "inf" : "-inf");
    const std::string ret = c.retrieval_acc ? fmt("%.1f%%", 100.0 * *c.retrieval_acc) : "-";
    std::snprintf(line, sizeof line, "%-34s %12.3f %10.2f %10s %10s\n", c.name.c_str(), c.kl_1e3, c.top1_mismatch_pct,
                  t.c_str(), ret.c_str());
    s << line;
  }
  s << fmt("\n%.1f s\n", seconds);
  return s.str();
}

std::string EvalReport::json() const {
  nlohmann::json j;
  j["model"] = model;
  j["context"] = context;
  j["windows"] = windows;
  j["reference"] = reference;
  j["baseline"] = baseline;
  j["calibration"] = calibration;
  j["device"] = device;
  j["retrieval_docs"] = retrieval_docs;
  j["retrieval_context"] = retrieval_context;
  j["seconds"] = seconds;
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  j["configs"] = nlohmann::json::object();
  for (const auto& c : configs) {
    j["configs"][c.name] = {{"kl_1e3", num(c.kl_1e3)},
                            {"top1_mismatch_pct", num(c.top1_mismatch_pct)},
                            {"t_vs_baseline", num(c.t_vs_baseline)},
                            {"retrieval_acc", c.retrieval_acc ? nlohmann::json(*c.retrieval_acc) : nlohmann::json(nullptr)},
                            {"retrieval_questions", c.retrieval_questions},
                            {"window_kl_1e3", [&] {
                               std::vector<double> v;
                               for (double x : c.window_kl) v.push_back(1e3 * x);
                               return v;
                             }()}};
  }
  return j.dump(2) + "\n";
}

}  // namespace fp4kv::eval
