// How one decode step sees a sequence of N tokens (SPEC sections 4-5): which tokens come
// from quantized pages and which from the BF16 slot (sink + recent). One definition, used
// by the CPU reference, the control kernel and the decode kernel.
//
// A page is promoted (quantized) after the step that wrote its last token, so a step with
// N tokens attends to floor((N-1)/128) quantized pages and 1..128 recent BF16 tokens (the
// unfinished page; every preset keeps it). With the BF16 sink, the first 16 tokens are
// BF16 too and their quantized copy in page 0 is masked. Without the BF16 recent
// (`no-recent`: quantize on write), the unfinished page is quantized as it stands
// (zero-padded) and re-quantized at each step.
#pragma once

#include "fp4kv/core/host_device.h"

namespace fp4kv {

struct DecodeLayout {
  int quant_pages = 0;       // quantized pages attended
  int last_page_tokens = 0;  // valid tokens of the last quantized page (128 unless partial)
  int masked_prefix = 0;     // leading tokens of page 0 not attended there (BF16 sink copy)
  int sink_tokens = 0;       // BF16 tokens [0, sink_tokens)
  int recent_begin = 0;      // BF16 tokens [recent_begin, recent_end)
  int recent_end = 0;
  FP4KV_HD int bf16_tokens() const { return sink_tokens + recent_end - recent_begin; }
};

// quantized: the cache stores pages (FP8/NVFP4/MXFP4); false for BF16/FP32 caches.
FP4KV_HD DecodeLayout decode_layout(int n_tokens, bool quantized, bool bf16_sink, bool bf16_recent,
                                    int page_tokens = 128, int sink = 16) {
  DecodeLayout l;
  if (n_tokens <= 0) return l;
  if (!quantized) {
    l.recent_end = n_tokens;
    return l;
  }
  if (bf16_recent) {
    l.quant_pages = (n_tokens - 1) / page_tokens;
    l.recent_end = n_tokens;
    if (l.quant_pages == 0) return l;  // everything is still in the BF16 slot
    l.last_page_tokens = page_tokens;
    l.recent_begin = l.quant_pages * page_tokens;
  } else {
    l.quant_pages = (n_tokens + page_tokens - 1) / page_tokens;
    l.last_page_tokens = n_tokens - (l.quant_pages - 1) * page_tokens;
    l.recent_begin = l.recent_end = n_tokens;
  }
  if (bf16_sink) {
    l.sink_tokens = n_tokens < sink ? n_tokens : sink;
    l.masked_prefix = sink;
  }
  return l;
}

}  // namespace fp4kv
