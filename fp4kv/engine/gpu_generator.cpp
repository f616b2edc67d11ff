#include "fp4kv/engine/gpu_generator.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::engine {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GenerateStats generate_on_gpu(StepModel& model, const std::vector<int>& prompt, const GenerateOptions& o,
                              const std::function<void(int token)>& on_token) {
  check_generate_options(model.config(), prompt, o);
  const long long total = (long long)prompt.size() + o.max_tokens;
  require(total <= model.options().max_context,
          "generate: prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens " +
              std::to_string(o.max_tokens) + " exceeds the engine's max_context " +
              std::to_string(model.options().max_context));
  require((long long)model.max_pages() <= model.num_blocks(), "generate: the cache has fewer blocks than one request needs");
  GenerateStats stats;
  stats.prompt_tokens = int(prompt.size());
  StepRows rows = consecutive_rows(1, model.max_pages());
  auto t0 = std::chrono::steady_clock::now();
  if (model.options().prefill_chunk > 0) {  // the tensor-core prefill
    model.prefill(std::vector<int32_t>(prompt.begin(), prompt.end()), 0, rows.block_tables);
    rows.seq_lens[0] = int(prompt.size());
  } else {
    for (size_t t = 0; t < prompt.size(); ++t) {
      rows.tokens[0] = prompt[t];
      rows.seq_lens[0] = int(t) + 1;
      model.step(rows);
    }
  }
  for (int step = 0; step < o.max_tokens; ++step) {
    SamplingRow draw = o.sampling;
    draw.step = uint64_t(step);
    const int token = model.sample({draw})[0];
    ++stats.generated;
    if (step == 0) {
      stats.prefill_seconds = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    }
    on_token(token);
    if (o.stop_at_eos && model.config().is_eos(token)) {
      stats.stopped_at_eos = true;
      break;
    }
    if (step + 1 < o.max_tokens) {
      rows.tokens[0] = token;
      rows.seq_lens[0] += 1;
      model.step(rows);
    }
  }
  stats.decode_seconds = seconds_since(t0);
  model.release(rows.block_tables[0]);
  model.synchronize();
  return stats;
}

void forced_logits_on_gpu(
    StepModel& model, const std::vector<std::vector<int>>& sequences,
    const std::function<void(int position, const std::vector<int>& rows, const std::vector<float>& logits)>& on_step) {
  const int B = int(sequences.size()), P = model.max_pages();
  require(B >= 1 && B <= model.options().max_batch, "forced_logits_on_gpu: " + std::to_string(B) +
                                                        " sequences for a max_batch of " +
                                                        std::to_string(model.options().max_batch));
  require((long long)B * P <= model.num_blocks(), "forced_logits_on_gpu: " + std::to_string(B) + " sequences need " +
                                                      std::to_string((long long)B * P) + " cache blocks, the cache has " +
                                                      std::to_string(model.num_blocks()));
  size_t longest = 0;
  for (const auto& s : sequences) {
    require(!s.empty() && (long long)s.size() <= model.options().max_context,
            "forced_logits_on_gpu: a sequence of " + std::to_string(s.size()) + " tokens (max_context " +
                std::to_string(model.options().max_context) + ")");
    longest = std::max(longest, s.size());
  }
  // Sequence s owns blocks [s * P, (s + 1) * P) for its whole run.
  StepRows rows;
  std::vector<int> active;
  for (size_t t = 0; t < longest; ++t) {
    rows.tokens.clear();
    rows.seq_lens.clear();
    rows.block_tables.clear();
    active.clear();
    for (int s = 0; s < B; ++s) {
      if (sequences[s].size() <= t) continue;
      active.push_back(s);
      rows.tokens.push_back(sequences[s][t]);
      rows.seq_lens.push_back(int(t) + 1);
      for (int p = 0; p < P; ++p) rows.block_tables.push_back(s * P + p);
    }
    model.step(rows);
    on_step(int(t), active, model.read_logits());
  }
  for (int s = 0; s < B; ++s) model.release(s * P);
  model.synchronize();
}

std::vector<std::vector<float>> forced_logits_on_gpu(StepModel& model, const std::vector<std::vector<int>>& sequences) {
  const size_t V = size_t(model.config().vocab_size), group = size_t(model.options().max_batch);
  std::vector<std::vector<float>> out(sequences.size());
  for (size_t first = 0; first < sequences.size(); first += group) {
    const size_t n = std::min(group, sequences.size() - first);
    const std::vector<std::vector<int>> part(sequences.begin() + first, sequences.begin() + first + n);
    for (size_t i = 0; i < n; ++i) out[first + i].resize(part[i].size() * V);
    forced_logits_on_gpu(model, part, [&](int t, const std::vector<int>& rows, const std::vector<float>& logits) {
      for (size_t r = 0; r < rows.size(); ++r)
        std::copy(logits.begin() + r * V, logits.begin() + (r + 1) * V, out[first + rows[r]].begin() + size_t(t) * V);
    });
  }
  return out;
}

}  // namespace fp4kv::engine
