// What DecodeAttention needs from the GPU cache (fp4kv/cache/kv_cache.h): the geometry and
// capacity a model's DecodeAttention is built with, the per-step inputs (the cache's step
// plan) and one layer's view, so an engine's decode step reads
//   cache.begin_step(...);  for each layer L: cache.append(L, ...), attn.run(step, layer_view(cache, L), ...)
#pragma once

#include "fp4kv/attention/decode.h"
#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/cache/kv_cache.h"

namespace fp4kv::attention {

inline DecodeGeometry geometry_of(const cache::KvCache& c, int q_heads) {
  return DecodeGeometry{q_heads, c.config().kv_heads, c.config().head_dim};
}

// The cache's capacity: its batch, block-table row stride and split capacity.
inline DecodeCapacity capacity_of(const cache::KvCache& c) {
  const cache::KvCacheConfig& cfg = c.config();
  return DecodeCapacity{cfg.max_batch, cfg.max_pages, cfg.max_splits};
}

// One decode step over the cache: block tables [batch][config.max_pages], lengths, and the
// plan the cache's control kernel writes in begin_step.
inline DecodeStep step_of(const cache::KvCache& c, const int32_t* block_tables, const int32_t* seq_lens, int batch) {
  DecodeStep s;
  s.block_tables = block_tables;
  s.seq_lens = seq_lens;
  s.batch = batch;
  s.plan = c.plan();
  return s;
}

inline DecodeLayerView layer_view(const cache::KvCache& c, int layer) {
  const cache::KvCacheConfig& cfg = c.config();
  DecodeLayerView v;
  v.format = c.layout().format;
  v.pool = c.pool(layer);
  v.block_stride = c.block_stride();
  v.slot_buffer = c.slot_buffer() ? c.slot_buffer() + cache::slot_row_offset(layer, 0, 0, 0, 0, cfg.max_slots,
                                                                             cfg.kv_heads, cfg.head_dim)
                                  : nullptr;
  v.slots = cfg.max_slots;
  v.mu_k = c.mu_k_device() ? c.mu_k_device() + size_t(layer) * cfg.kv_heads * cfg.head_dim : nullptr;
  return v;
}

// MLA: one layer of a latent cache (KvCacheConfig::rope_dim > 0) as MlaDecodeAttention's step,
// after the cache's begin_step (its plan holds each row's slot); `splits` per row.
inline MlaStep mla_step(const cache::KvCache& c, int layer, const int32_t* block_tables, const int32_t* seq_lens,
                        int batch, int splits) {
  MlaStep s;
  s.pool = c.pool(layer);
  s.block_stride = c.block_stride();
  s.block_tables = block_tables;
  s.seq_lens = seq_lens;
  s.batch = batch;
  s.splits = splits;
  if (c.layout().format != KvFormat::bf16) {
    s.slot_rows = c.latent_slot_rows(layer);
    s.row_slot = c.plan().row_slot;
  }
  s.mu_c = c.mu_k_device() ? c.mu_k_device() + size_t(layer) * c.config().head_dim : nullptr;
  return s;
}

}  // namespace fp4kv::attention
