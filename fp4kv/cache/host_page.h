// Host-side packing between the CPU reference's logical page (ref::QuantPage) and the
// cache's byte layout (layout.h): how tests compare GPU pages byte for byte with the CPU
// quantizer, and how a page read back from the GPU is dequantized for debugging.
#pragma once

#include <cstdint>
#include <vector>

#include "fp4kv/cache/layout.h"
#include "fp4kv/ref/quant_page.h"

namespace fp4kv::cache {

// The MXFP4 page scale of a slice: 2^(emax - 15) over its block scale codes (layout.h).
float mxfp4_page_scale(const uint8_t* scale_codes, int n);

// Writes one head's part (layout.bytes bytes) from a quantized page (NVFP4, MXFP4, FP8).
void pack_page(const ref::QuantPage& page, const PageLayout& layout, uint8_t* out);
// Reads it back; `tokens` is the number of valid tokens to record.
ref::QuantPage unpack_page(const uint8_t* in, const PageLayout& layout, int tokens = kPage);

// BF16 pages: K and V rows [128][d] given as floats (already BF16 values), and back.
void pack_bf16_page(const float* k, const float* v, int tokens, const PageLayout& layout, uint8_t* out);
void unpack_bf16_page(const uint8_t* in, const PageLayout& layout, float* k, float* v);

// MLA latent pages (layout.h LatentPageLayout): the latent as a logical page's key side
// (ref::QuantPage k_*; its value side unused) and the positional keys r [128][rope_dim] as
// floats (BF16 values; rows past `tokens` are zero). BF16 latent pages carry the latent as
// rows of `c` instead.
void pack_latent_page(const ref::QuantPage& latent, const float* r, int tokens, const LatentPageLayout& layout,
                      uint8_t* out);
ref::QuantPage unpack_latent_page(const uint8_t* in, const LatentPageLayout& layout, float* r, int tokens = kPage);
void pack_bf16_latent_page(const float* c, const float* r, int tokens, const LatentPageLayout& layout, uint8_t* out);
void unpack_bf16_latent_page(const uint8_t* in, const LatentPageLayout& layout, float* c, float* r);

}  // namespace fp4kv::cache
