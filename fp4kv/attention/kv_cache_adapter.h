// The DecodeParams of one layer of the GPU cache (fp4kv/cache/kv_cache.h).
#pragma once

#include "fp4kv/attention/decode.h"
#include "fp4kv/cache/kv_cache.h"

namespace fp4kv::attention {

inline DecodeParams params_from_cache(const cache::KvCache& c, int layer, int q_heads) {
  const cache::KvCacheConfig& cfg = c.config();
  DecodeParams p;
  p.pool = c.pool(layer);
  p.block_stride = c.block_stride();
  p.layout = c.layout();
  p.kv_heads = cfg.kv_heads;
  p.q_heads = q_heads;
  p.head_dim = cfg.head_dim;
  p.slot_buffer = c.slot_buffer() ? c.slot_buffer() + cache::slot_row_offset(layer, 0, 0, 0, 0, cfg.max_slots,
                                                                             cfg.kv_heads, cfg.head_dim)
                                  : nullptr;
  p.slots = cfg.max_slots;
  p.mu_k = c.mu_k_device() ? c.mu_k_device() + size_t(layer) * cfg.kv_heads * cfg.head_dim : nullptr;
  return p;
}

}  // namespace fp4kv::attention
