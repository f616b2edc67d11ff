#include "fp4kv/eval/limits.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace fp4kv::eval {

namespace {

constexpr uint64_t kUnknown = UINT64_MAX;
constexpr double kFloatBytes = 4.0;
// Score rows the attention works on at once (the exact runner's block and the quantized
// runner's row block are both at most this many query rows).
constexpr double kScoreRowsPerWorker = 256.0;
// Quantized attention keeps several float copies of one layer's K and V (quantized,
// dequantized, per-head gathers); four covers each runner.
constexpr double kAttentionKvCopies = 4.0;

// A "<key>: <number> kB" field of a /proc file, in bytes; kUnknown when absent.
uint64_t proc_kb_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream s(line.substr(key.size() + 1));
    uint64_t kb = 0;
    if (s >> kb) return kb * 1024;
  }
  return kUnknown;
}

// A cgroup v2 file holding one number ("max" means no limit); kUnknown when absent.
uint64_t cgroup_value(const char* file) {
  std::ifstream in(file);
  uint64_t v = 0;
  return (in >> v) ? v : kUnknown;
}

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(1ull << 30));
  return b;
}

}  // namespace

uint64_t available_memory_bytes() {
  uint64_t avail = proc_kb_field("/proc/meminfo", "MemAvailable");
  const uint64_t cg_max = cgroup_value("/sys/fs/cgroup/memory.max");
  const uint64_t cg_cur = cgroup_value("/sys/fs/cgroup/memory.current");
  if (cg_max != kUnknown && cg_cur != kUnknown) avail = std::min(avail, cg_max > cg_cur ? cg_max - cg_cur : 0);
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const uint64_t mapped = proc_kb_field("/proc/self/status", "VmSize");
    if (mapped != kUnknown) avail = std::min<uint64_t>(avail, as.rlim_cur > mapped ? as.rlim_cur - mapped : 0);
  }
  return avail == kUnknown ? 0 : std::max<uint64_t>(avail, 1);
}

double forward_pass_bytes(const model::Qwen3Config& c, int64_t tokens, const ForwardFootprint& f) {
  const double L = double(tokens), H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const double d = c.head_dim, nq = c.num_attention_heads, nkv = c.num_key_value_heads;
  const double layers = c.num_hidden_layers, workers = std::max(1u, std::thread::hardware_concurrency());
  const double qkv = (nq + 2 * nkv) * d;
  // MLP: the dense block's gate_up and product; the sparse block's router logits and, per
  // chosen expert, the gathered input, gate_up, product and output (model/moe.cpp).
  const double dense_mlp = 3 * I;
  const double sparse_mlp =
      c.is_moe() ? c.num_experts + double(c.num_experts_per_tok) * (2 * H + 3 * c.moe_intermediate_size) : 0.0;
  // Residual, norm output, projection output, RoPE tables, q/k/v, attention output twice, MLP.
  const double per_token = 3 * H + d + 2 * qkv + 2 * nq * d + std::max(dense_mlp, sparse_mlp);
  const double attention = kAttentionKvCopies * 2 * nkv * d * L + workers * kScoreRowsPerWorker * 2 * L;
  double floats = per_token * L + attention + f.logits_copies * L * V;
  if (f.capture_all_layers) floats += layers * qkv * L;
  floats += f.kv_states * layers * 2 * nkv * d * L;
  return floats * kFloatBytes;
}

void require_within_positions(const model::Qwen3Config& c, int64_t tokens, const std::string& option) {
  if (c.max_position_embeddings <= 0) return;
  require(tokens <= c.max_position_embeddings,
          option + ": " + std::to_string(tokens) + " tokens exceed the model's max_position_embeddings of " +
              std::to_string(c.max_position_embeddings) + " (config.json)");
}

void require_fits_memory(double bytes, uint64_t available, const std::string& option, const std::string& work) {
  if (available == 0) return;
  require(bytes <= double(available), option + ": " + work + " needs about " + gib(bytes) + " of memory, but only " +
                                          gib(double(available)) + " is available");
}

void require_regular_file(const std::string& path, const std::string& option) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  require(fs::exists(st), option + ": cannot read '" + path + "': it does not exist");
  require(!fs::is_directory(st), option + ": '" + path + "' is a directory, not a file");
  require(fs::is_regular_file(st), option + ": '" + path + "' is not a regular file");
}

}  // namespace fp4kv::eval
