#include "fp4kv/cache/kv_cache.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/host_page.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/hadamard.h"

namespace fp4kv::cache {

namespace {

// The card's peak DRAM bandwidth (GB/s) from its memory clock and bus width (double data
// rate); 0 when the driver does not say.
double peak_read_gbps(int dev) {
  int khz = 0, bits = 0;
  if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  constexpr double kDataRate = 2, kBitsPerByte = 8;
  return kDataRate * khz * 1e3 * bits / kBitsPerByte / 1e9;
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

void require_device_ptr(const void* p, size_t align, const char* name) {
  require(p != nullptr, std::string("KvCache: ") + name + " is null");
  require(aligned(p, align), std::string("KvCache: ") + name + " is not " + std::to_string(align) + "-byte aligned");
}

// BF16 elements of one slot's rows in one layer.
size_t slot_elements(const KvCacheConfig& c) {
  if (c.rope_dim != 0) return size_t(kSlotRows) * (c.head_dim + c.rope_dim);
  return size_t(c.kv_heads) * 2 * kSlotRows * c.head_dim;
}

}  // namespace

KvCache::KvCache(const KvCacheConfig& c, const Recipe& recipe, const float* mu_k, const DeviceMemorySource* memory)
    : config_(c), recipe_(recipe) {
  require(gpu_format_supported(recipe.kv),
          "KvCache: format " + to_string(recipe.kv) + " is not a GPU cache format (bf16, fp8, nvfp4, mxfp4)");
  if (c.rope_dim != 0) {
    require(c.rope_dim == kMlaRopeDim && c.head_dim == kMlaLatentDim && c.kv_heads == 1,
            "KvCache: an MLA latent cache has kv_heads 1, head_dim (latent) 512 and rope_dim 64; got kv_heads " +
                std::to_string(c.kv_heads) + ", head_dim " + std::to_string(c.head_dim) + ", rope_dim " +
                std::to_string(c.rope_dim));
    require(recipe.kv != KvFormat::fp8, "KvCache: MLA latent caches are bf16, nvfp4 or mxfp4 (no fp8 MLA kernel)");
  } else {
    require(gpu_head_dim_supported(c.head_dim),
            "KvCache: head_dim " + std::to_string(c.head_dim) + " is not supported (64, 128, 256)");
  }
  require(c.layers >= 1 && c.kv_heads >= 1, "KvCache: layers and kv_heads must be >= 1");
  require(c.num_blocks >= 1, "KvCache: num_blocks must be >= 1");
  require(c.max_slots >= 1 && c.max_slots <= detail::kControlMaxSlots,
          "KvCache: max_slots must be in [1, " + std::to_string(detail::kControlMaxSlots) + "], got " +
              std::to_string(c.max_slots));
  require(c.max_batch >= 1 && c.max_batch <= detail::kControlMaxRows,
          "KvCache: max_batch must be in [1, " + std::to_string(detail::kControlMaxRows) + "], got " +
              std::to_string(c.max_batch));
  require(c.max_pages >= 1, "KvCache: max_pages must be >= 1");
  require(c.max_splits >= 1, "KvCache: max_splits must be >= 1");
  require(!recipe.rotate_keys || hadamard_supported(c.head_dim), "KvCache: no Hadamard transform for this head_dim");

  dims_.layers = c.layers;
  dims_.heads = c.kv_heads;
  dims_.d = c.head_dim;
  dims_.num_blocks = c.num_blocks;
  dims_.slots = c.max_slots;
  dims_.format = recipe.kv;
  if (c.rope_dim != 0) {
    const LatentPageLayout latent = LatentPageLayout::make(recipe.kv, c.head_dim, c.rope_dim);
    dims_.layout = latent.latent_part();
    dims_.rope_dim = c.rope_dim;
    dims_.r_rows = latent.r_rows;
  } else {
    dims_.layout = PageLayout::make(recipe.kv, c.head_dim);
  }
  dims_.block_stride = static_cast<long long>(c.kv_heads) * dims_.layout.bytes;
  dims_.layer_stride = dims_.block_stride * c.num_blocks;
  dims_.smooth = recipe.smooth_keys;
  dims_.rotate = recipe.rotate_keys;
  dims_.search = recipe.key_search;
  dims_.sink = recipe.bf16_sink && recipe.kv != KvFormat::bf16;
  dims_.recent = recipe.bf16_recent || recipe.kv == KvFormat::bf16;
  dims_.split_floor = split_floor(recipe);
  dims_.max_one_wave_pages = max_one_wave_pages(recipe);

  int dev = 0, count = 0;
  cuda_check(cudaGetDeviceCount(&count), "KvCache: no CUDA device");
  require(count > 0, "KvCache: no CUDA device");
  cuda_check(cudaGetDevice(&dev), "KvCache: cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, dev), "KvCache: multiprocessor count");
  dims_.balance_sms = issue_bound_sms(recipe, num_sms_, peak_read_gbps(dev));

  auto alloc = [&](size_t bytes, const char* what) -> void* {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    if (memory != nullptr) {  // the caller's memory: zeroed here, never freed here
      p = memory->allocate(bytes, what);
      require(p != nullptr && aligned(p, 256), std::string("KvCache: the memory source gave no 256-byte aligned ") +
                                                   "memory for " + what);
      device_bytes_ += bytes;
      cuda_check(cudaMemset(p, 0, bytes), "KvCache: cudaMemset");
      return p;
    }
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      for (void* q : allocations_) cudaFree(q);
      allocations_.clear();
      throw_cuda_error(err, "KvCache: cannot allocate " + std::to_string(bytes) + " bytes for " + what);
    }
    allocations_.push_back(p);
    device_bytes_ += bytes;
    cuda_check(cudaMemset(p, 0, bytes), "KvCache: cudaMemset");
    return p;
  };
  const size_t L = size_t(c.layers), S = size_t(c.max_slots), H = size_t(c.kv_heads), d = size_t(c.head_dim);
  const size_t MB = size_t(c.max_batch);
  mem_.pool = static_cast<uint8_t*>(alloc(L * size_t(dims_.layer_stride), "the block pools"));
  if (dims_.quantized())
    mem_.slots = static_cast<uint16_t*>(alloc(L * S * slot_elements(c) * sizeof(uint16_t), "the slot buffer"));
  if (recipe.smooth_keys && mu_k) {
    float* mu = static_cast<float*>(alloc(L * H * d * sizeof(float), "mu_k"));
    cuda_check(cudaMemcpy(mu, mu_k, L * H * d * sizeof(float), cudaMemcpyHostToDevice), "KvCache: copy mu_k");
    mem_.mu = mu;
  }
  mem_.nonfinite = static_cast<unsigned long long*>(alloc(sizeof(unsigned long long), "counters"));
  mem_.error_flags = static_cast<int32_t*>(alloc(sizeof(int32_t), "flags"));
  mem_.slot_owner = static_cast<int32_t*>(alloc(S * sizeof(int32_t), "the slot table"));
  mem_.slot_last_seen = static_cast<long long*>(alloc(S * sizeof(long long), "the slot table"));
  cuda_check(cudaMemset(mem_.slot_owner, 0xFF, S * sizeof(int32_t)), "KvCache: cudaMemset");        // -1: free
  cuda_check(cudaMemset(mem_.slot_last_seen, 0xFF, S * sizeof(long long)), "KvCache: cudaMemset");  // -1: never seen
  mem_.step_counter = static_cast<long long*>(alloc(sizeof(long long), "the step counter"));
  mem_.prefill_slot = static_cast<int32_t*>(alloc(sizeof(int32_t), "the prefill slot"));
  cuda_check(cudaMemset(mem_.prefill_slot, 0xFF, sizeof(int32_t)), "KvCache: cudaMemset");
  mem_.promote_rows = static_cast<int32_t*>(alloc(MB * sizeof(int32_t), "the promotion list"));
  mem_.promote_count = static_cast<int32_t*>(alloc(sizeof(int32_t), "the promotion list"));

  plan_.row_slot = static_cast<int32_t*>(alloc(MB * sizeof(int32_t), "the step plan"));
  plan_.row_splits = static_cast<int32_t*>(alloc(MB * sizeof(int32_t), "the step plan"));
  plan_.row_pages_per_split = static_cast<int32_t*>(alloc(MB * sizeof(int32_t), "the step plan"));
  plan_.row_promote_block = static_cast<int32_t*>(alloc(MB * sizeof(int32_t), "the step plan"));
  plan_.row_pages = static_cast<int32_t*>(alloc(MB * sizeof(int32_t), "the step plan"));
  plan_.num_rows = static_cast<int32_t*>(alloc(sizeof(int32_t), "the step plan"));
  cuda_check(cudaMemset(plan_.row_slot, 0xFF, MB * sizeof(int32_t)), "KvCache: cudaMemset");
  cuda_check(cudaMemset(plan_.row_promote_block, 0xFF, MB * sizeof(int32_t)), "KvCache: cudaMemset");
  plan_.error_flags = mem_.error_flags;
  plan_.max_splits = c.max_splits;
  cuda_check(cudaDeviceSynchronize(), "KvCache: initialization");
  detail::prepare_page_kernels(dims_);
  detail::prepare_control_kernel();
}

KvCache::~KvCache() {
  for (void* p : allocations_) cudaFree(p);
}

void KvCache::check_layer(int layer) const {
  require(layer >= 0 && layer < config_.layers,
          "KvCache: layer " + std::to_string(layer) + " out of range [0, " + std::to_string(config_.layers) + ")");
}

const uint8_t* KvCache::pool(int layer) const {
  check_layer(layer);
  return mem_.pool + layer * dims_.layer_stride;
}

// ---- prefill ----

void KvCache::begin_prefill(const int32_t* block_row, int first_token_pos, int n_tokens, cudaStream_t stream) {
  require_device_ptr(block_row, 4, "block_row");
  require(first_token_pos >= 0 && n_tokens >= 0, "KvCache::begin_prefill: negative token position or count");
  const long long end = static_cast<long long>(first_token_pos) + n_tokens;
  require(end <= static_cast<long long>(config_.max_pages) * kPage,
          "KvCache::begin_prefill: tokens up to " + std::to_string(end) + " exceed max_pages * 128 = " +
              std::to_string(static_cast<long long>(config_.max_pages) * kPage));
  prefill_ = detail::PrefillArgs{};
  prefill_.block_row = block_row;
  prefill_.first = first_token_pos;
  prefill_.end = static_cast<int>(end);
  have_prefill_ = true;
  if (n_tokens == 0) return;
  detail::launch_claim_prefill_slot(dims_, mem_, block_row, stream);
}

void KvCache::prefill(int layer, const float* k, const float* v, cudaStream_t stream) {
  require(have_prefill_, "KvCache::prefill: call begin_prefill first");
  check_layer(layer);
  if (prefill_.end == prefill_.first) return;
  require_device_ptr(k, 16, "k");
  require_device_ptr(v, 16, "v");
  detail::PrefillArgs a = prefill_;
  a.layer = layer;
  a.k = k;
  a.v = v;
  // Pages first: they read the recent rows of the previous chunk, which the rows overwrite.
  if (dims_.quantized()) detail::launch_prefill_pages(dims_, mem_, a, stream);
  detail::launch_prefill_rows(dims_, mem_, a, stream);
}

void KvCache::prefill(int layer, const int32_t* block_row, int first_token_pos, int n_tokens, const float* k,
                      const float* v, cudaStream_t stream) {
  begin_prefill(block_row, first_token_pos, n_tokens, stream);
  prefill(layer, k, v, stream);
}

// ---- decode step ----

void KvCache::begin_step(const int32_t* block_tables, const int32_t* seq_lens, int batch, int max_pages,
                         cudaStream_t stream) {
  require_device_ptr(block_tables, 4, "block_tables");
  require_device_ptr(seq_lens, 4, "seq_lens");
  require(batch >= 1 && batch <= config_.max_batch, "KvCache::begin_step: batch " + std::to_string(batch) +
                                                        " outside [1, max_batch = " +
                                                        std::to_string(config_.max_batch) + "]");
  require(max_pages >= 1, "KvCache::begin_step: max_pages must be >= 1");
  step_ = detail::StepArgs{};
  step_.block_tables = block_tables;
  step_.seq_lens = seq_lens;
  step_.batch = batch;
  step_.max_pages = max_pages;
  step_.max_batch = config_.max_batch;
  have_step_ = true;
  detail::launch_control(dims_, mem_, plan_, step_, num_sms_, stream);
}

void KvCache::append(int layer, const float* k, const float* v, cudaStream_t stream) {
  require(have_step_, "KvCache::append: call begin_step first");
  check_layer(layer);
  require_device_ptr(k, 16, "k");
  require_device_ptr(v, 16, "v");
  detail::StepArgs a = step_;
  a.layer = layer;
  a.k = k;
  a.v = v;
  detail::launch_append(dims_, mem_, plan_, a, stream);
  finish_append(layer, stream);
}

AppendTarget KvCache::append_target(int layer) const {
  require(have_step_, "KvCache::append_target: call begin_step first");
  check_layer(layer);
  require(!dims_.latent(), "KvCache::append_target: a latent (MLA) cache appends through append()");
  AppendTarget t{dims_, mem_, plan_, step_};
  t.step.layer = layer;
  return t;
}

void KvCache::finish_append(int layer, cudaStream_t stream) {
  require(have_step_, "KvCache::finish_append: call begin_step first");
  check_layer(layer);
  // Without BF16 recent rows the open page is quantized again from the rows just written.
  if (dims_.quantized() && !dims_.recent) {
    detail::StepArgs a = step_;
    a.layer = layer;
    detail::launch_requantize_open_pages(dims_, mem_, plan_, a, stream);
  }
}

void KvCache::end_step(cudaStream_t stream) {
  require(have_step_, "KvCache::end_step: call begin_step first");
  if (dims_.quantized() && dims_.recent) detail::launch_promote(dims_, mem_, plan_, step_, stream);
}

void KvCache::release(int32_t first_block, cudaStream_t stream) {
  require(first_block >= 0 && first_block < config_.num_blocks,
          "KvCache::release: block " + std::to_string(first_block) + " out of range");
  detail::launch_release_slot(dims_, mem_, first_block, stream);
}

// ---- host queries ----

unsigned long long KvCache::nonfinite_count() const {
  unsigned long long n = 0;
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  cuda_check(cudaMemcpy(&n, mem_.nonfinite, sizeof n, cudaMemcpyDeviceToHost), "KvCache: read the non-finite counter");
  return n;
}

int32_t KvCache::error_flags() const {
  int32_t f = 0;
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  cuda_check(cudaMemcpy(&f, mem_.error_flags, sizeof f, cudaMemcpyDeviceToHost), "KvCache: read the error flags");
  return f;
}

void KvCache::clear_errors(cudaStream_t stream) {
  cuda_check(cudaMemsetAsync(mem_.error_flags, 0, sizeof(int32_t), stream), "KvCache: clear the error flags");
  cuda_check(cudaStreamSynchronize(stream), "KvCache: synchronize");
}

void KvCache::reset_nonfinite_count(cudaStream_t stream) {
  cuda_check(cudaMemsetAsync(mem_.nonfinite, 0, sizeof(unsigned long long), stream), "KvCache: reset the counter");
  cuda_check(cudaStreamSynchronize(stream), "KvCache: synchronize");
}

int KvCache::slot_of(int32_t first_block) const {
  std::vector<int32_t> owner(config_.max_slots);
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  cuda_check(cudaMemcpy(owner.data(), mem_.slot_owner, owner.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
        "KvCache: read the slot table");
  for (int s = 0; s < config_.max_slots; ++s)
    if (owner[s] == first_block) return s;
  return -1;
}

long long KvCache::step_counter() const {
  long long n = 0;
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  cuda_check(cudaMemcpy(&n, mem_.step_counter, sizeof n, cudaMemcpyDeviceToHost), "KvCache: read the step counter");
  return n;
}

std::vector<uint8_t> KvCache::read_page(int layer, int block, int head) const {
  check_layer(layer);
  require(block >= 0 && block < config_.num_blocks, "KvCache::read_page: block " + std::to_string(block) + " out of range");
  require(head >= 0 && head < config_.kv_heads, "KvCache::read_page: head " + std::to_string(head) + " out of range");
  std::vector<uint8_t> bytes(dims_.layout.bytes);
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  cuda_check(cudaMemcpy(bytes.data(), pool(layer) + block * dims_.block_stride + static_cast<long long>(head) * dims_.layout.bytes,
                   bytes.size(), cudaMemcpyDeviceToHost),
        "KvCache: read a page");
  return bytes;
}

ref::QuantPage KvCache::read_quant_page(int layer, int block, int head, int tokens) const {
  require(dims_.quantized(), "KvCache::read_quant_page: the BF16 format has no quantized pages (use read_page)");
  require(!dims_.latent(), "KvCache::read_quant_page: a latent page is unpacked with unpack_latent_page(read_page())");
  const auto bytes = read_page(layer, block, head);
  return unpack_page(bytes.data(), dims_.layout, tokens);
}

SlotRows KvCache::read_slot(int layer, int slot, int head) const {
  check_layer(layer);
  require(dims_.quantized(), "KvCache::read_slot: the BF16 format keeps no slot rows");
  require(slot >= 0 && slot < config_.max_slots, "KvCache::read_slot: slot " + std::to_string(slot) + " out of range");
  require(head >= 0 && head < config_.kv_heads, "KvCache::read_slot: head " + std::to_string(head) + " out of range");
  if (dims_.latent()) return read_latent_slot(layer, slot);
  const int d = config_.head_dim;
  std::vector<uint16_t> bits(size_t(2) * kSlotRows * d);
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  cuda_check(cudaMemcpy(bits.data(), mem_.slots + slot_row_offset(layer, slot, head, 0, 0, config_.max_slots, config_.kv_heads, d),
                   bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost),
        "KvCache: read a slot");
  SlotRows r;
  r.k.resize(size_t(kSlotRows) * d);
  r.v.resize(size_t(kSlotRows) * d);
  for (size_t i = 0; i < r.k.size(); ++i) {
    r.k[i] = bf16_bits_to_float(bits[i]);
    r.v[i] = bf16_bits_to_float(bits[r.k.size() + i]);
  }
  return r;
}

SlotRows KvCache::read_latent_slot(int layer, int slot) const {
  const int dc = config_.head_dim, dr = config_.rope_dim, w = dc + dr;
  std::vector<uint16_t> bits(size_t(kSlotRows) * w);
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  cuda_check(cudaMemcpy(bits.data(), mem_.slots + latent_slot_row_offset(layer, slot, 0, config_.max_slots, dc, dr),
                        bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost),
             "KvCache: read a slot");
  SlotRows r;
  r.k.resize(size_t(kSlotRows) * dc);
  r.v.resize(size_t(kSlotRows) * dr);
  for (int row = 0; row < kSlotRows; ++row) {
    for (int x = 0; x < dc; ++x) r.k[size_t(row) * dc + x] = bf16_bits_to_float(bits[size_t(row) * w + x]);
    for (int x = 0; x < dr; ++x) r.v[size_t(row) * dr + x] = bf16_bits_to_float(bits[size_t(row) * w + dc + x]);
  }
  return r;
}

const uint16_t* KvCache::latent_slot_rows(int layer) const {
  check_layer(layer);
  require(dims_.latent() && dims_.quantized(), "KvCache::latent_slot_rows: not a quantized MLA latent cache");
  return mem_.slots + latent_slot_row_offset(layer, 0, 0, config_.max_slots, config_.head_dim, config_.rope_dim);
}

KvCache::PlanCopy KvCache::read_plan() const {
  PlanCopy p;
  const size_t n = size_t(config_.max_batch);
  cuda_check(cudaDeviceSynchronize(), "KvCache: synchronize");
  auto get = [&](std::vector<int32_t>& out, const int32_t* src) {
    out.resize(n);
    cuda_check(cudaMemcpy(out.data(), src, n * sizeof(int32_t), cudaMemcpyDeviceToHost), "KvCache: read the plan");
  };
  get(p.row_slot, plan_.row_slot);
  get(p.row_splits, plan_.row_splits);
  get(p.row_pages_per_split, plan_.row_pages_per_split);
  get(p.row_promote_block, plan_.row_promote_block);
  get(p.row_pages, plan_.row_pages);
  cuda_check(cudaMemcpy(&p.num_rows, plan_.num_rows, sizeof(int32_t), cudaMemcpyDeviceToHost), "KvCache: read the plan");
  return p;
}

}  // namespace fp4kv::cache
