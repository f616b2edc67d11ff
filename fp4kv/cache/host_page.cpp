#include "fp4kv/cache/host_page.h"

#include <cstring>

#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv::cache {

float mxfp4_page_scale(const uint8_t* scale_codes, int n) {
  int emax = -127;
  for (int i = 0; i < n; ++i) emax = std::max(emax, int(scale_codes[i]) - kE8M0Bias);
  return pow2f(std::max(emax - 15, -149));
}

namespace {

void set_code(uint8_t* base, CodeAddress a, uint8_t code) {
  uint8_t& b = base[a.byte];
  b = a.odd ? fp4_stored_byte(fp4_code_of_stored(b, 0), code) : fp4_stored_byte(code, fp4_code_of_stored(b, 1));
}
uint8_t get_code(const uint8_t* base, CodeAddress a) { return fp4_code_of_stored(base[a.byte], a.odd); }

}  // namespace

void pack_page(const ref::QuantPage& p, const PageLayout& l, uint8_t* out) {
  require(p.format == l.format && p.d == l.head_dim, "pack_page: page and layout disagree on format or head_dim");
  std::memset(out, 0, size_t(l.bytes));
  const int d = l.head_dim;
  float scales[2] = {p.k_g, p.v_g};
  if (l.format == KvFormat::fp8) {
    for (int t = 0; t < kPage; ++t)
      for (int c = 0; c < d; ++c) {
        out[k_fp8_offset(l, t, c)] = p.k_codes[t * d + c];
        out[v_fp8_offset(l, t, c)] = p.v_codes[c * kPage + t];
      }
  } else {
    const int b = l.block;
    for (int t = 0; t < kPage; ++t)
      for (int c = 0; c < d; ++c) {
        set_code(out, k_code_address(l, t, c), p.k_codes[t * d + c]);
        set_code(out, v_code_address(l, t, c), p.v_codes[c * kPage + t]);
        if (c % b == 0) out[k_scale_offset(l, t, c)] = p.k_scales[t * (d / b) + c / b];
        if (t % b == 0) out[v_scale_offset(l, t, c)] = p.v_scales[c * (kPage / b) + t / b];
      }
    if (l.format == KvFormat::mxfp4) {
      scales[0] = mxfp4_page_scale(p.k_scales.data(), int(p.k_scales.size()));
      scales[1] = mxfp4_page_scale(p.v_scales.data(), int(p.v_scales.size()));
    }
  }
  std::memcpy(out + l.page_scales, scales, sizeof scales);
}

ref::QuantPage unpack_page(const uint8_t* in, const PageLayout& l, int tokens) {
  require(l.format == KvFormat::nvfp4 || l.format == KvFormat::mxfp4 || l.format == KvFormat::fp8,
          "unpack_page: not a quantized layout");
  ref::QuantPage p;
  p.format = l.format;
  p.d = l.head_dim;
  p.tokens = tokens;
  const int d = l.head_dim;
  p.k_codes.assign(size_t(kPage) * d, 0);
  p.v_codes.assign(size_t(kPage) * d, 0);
  float scales[2];
  std::memcpy(scales, in + l.page_scales, sizeof scales);
  if (l.format == KvFormat::fp8) {
    for (int t = 0; t < kPage; ++t)
      for (int c = 0; c < d; ++c) {
        p.k_codes[t * d + c] = in[k_fp8_offset(l, t, c)];
        p.v_codes[c * kPage + t] = in[v_fp8_offset(l, t, c)];
      }
    p.k_g = scales[0];
    p.v_g = scales[1];
    return p;
  }
  const int b = l.block;
  p.k_scales.assign(size_t(kPage) * (d / b), 0);
  p.v_scales.assign(size_t(d) * (kPage / b), 0);
  for (int t = 0; t < kPage; ++t)
    for (int c = 0; c < d; ++c) {
      p.k_codes[t * d + c] = get_code(in, k_code_address(l, t, c));
      p.v_codes[c * kPage + t] = get_code(in, v_code_address(l, t, c));
      if (c % b == 0) p.k_scales[t * (d / b) + c / b] = in[k_scale_offset(l, t, c)];
      if (t % b == 0) p.v_scales[c * (kPage / b) + t / b] = in[v_scale_offset(l, t, c)];
    }
  // The logical page has g = 1 for MXFP4 (the page scale is a layout detail).
  p.k_g = l.format == KvFormat::nvfp4 ? scales[0] : 1.0f;
  p.v_g = l.format == KvFormat::nvfp4 ? scales[1] : 1.0f;
  return p;
}

void pack_bf16_page(const float* k, const float* v, int tokens, const PageLayout& l, uint8_t* out) {
  require(l.format == KvFormat::bf16, "pack_bf16_page: not a BF16 layout");
  std::memset(out, 0, size_t(l.bytes));
  const int d = l.head_dim;
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < d; ++c) {
      const uint16_t kb = float_to_bf16_bits(k[t * d + c]), vb = float_to_bf16_bits(v[t * d + c]);
      std::memcpy(out + bf16_k_offset(l, t, c), &kb, 2);
      std::memcpy(out + bf16_v_offset(l, t, c), &vb, 2);
    }
}

void unpack_bf16_page(const uint8_t* in, const PageLayout& l, float* k, float* v) {
  const int d = l.head_dim;
  for (int t = 0; t < kPage; ++t)
    for (int c = 0; c < d; ++c) {
      uint16_t kb, vb;
      std::memcpy(&kb, in + bf16_k_offset(l, t, c), 2);
      std::memcpy(&vb, in + bf16_v_offset(l, t, c), 2);
      k[t * d + c] = bf16_bits_to_float(kb);
      v[t * d + c] = bf16_bits_to_float(vb);
    }
}

namespace {

void pack_r_rows(const float* r, int tokens, const LatentPageLayout& l, uint8_t* out) {
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < l.rope_dim; ++c) {
      const uint16_t b = float_to_bf16_bits(r[t * l.rope_dim + c]);
      std::memcpy(out + latent_r_offset(l, t, c), &b, 2);
    }
}

void unpack_r_rows(const uint8_t* in, const LatentPageLayout& l, float* r) {
  for (int t = 0; t < kPage; ++t)
    for (int c = 0; c < l.rope_dim; ++c) {
      uint16_t b;
      std::memcpy(&b, in + latent_r_offset(l, t, c), 2);
      r[t * l.rope_dim + c] = bf16_bits_to_float(b);
    }
}

}  // namespace

void pack_latent_page(const ref::QuantPage& p, const float* r, int tokens, const LatentPageLayout& l, uint8_t* out) {
  require(p.format == l.format && p.d == l.latent_dim && l.format != KvFormat::bf16,
          "pack_latent_page: page and layout disagree on format or latent size");
  std::memset(out, 0, size_t(l.bytes));
  const PageLayout k = l.latent_part();
  const int d = l.latent_dim;
  float scales[2] = {p.k_g, 0.0f};
  for (int t = 0; t < kPage; ++t)
    for (int c = 0; c < d; ++c) {
      if (l.format == KvFormat::fp8) {
        out[k_fp8_offset(k, t, c)] = p.k_codes[t * d + c];
        continue;
      }
      set_code(out, k_code_address(k, t, c), p.k_codes[t * d + c]);
      if (c % l.block == 0) out[k_scale_offset(k, t, c)] = p.k_scales[t * (d / l.block) + c / l.block];
    }
  if (l.format == KvFormat::mxfp4) scales[0] = mxfp4_page_scale(p.k_scales.data(), int(p.k_scales.size()));
  std::memcpy(out + l.page_scales, scales, sizeof scales);
  pack_r_rows(r, tokens, l, out);
}

ref::QuantPage unpack_latent_page(const uint8_t* in, const LatentPageLayout& l, float* r, int tokens) {
  require(l.format != KvFormat::bf16, "unpack_latent_page: a BF16 latent page has no codes");
  const PageLayout k = l.latent_part();
  const int d = l.latent_dim;
  ref::QuantPage p;
  p.format = l.format;
  p.d = d;
  p.tokens = tokens;
  p.k_codes.assign(size_t(kPage) * d, 0);
  float scales[2];
  std::memcpy(scales, in + l.page_scales, sizeof scales);
  if (l.format != KvFormat::fp8) p.k_scales.assign(size_t(kPage) * (d / l.block), 0);
  for (int t = 0; t < kPage; ++t)
    for (int c = 0; c < d; ++c) {
      if (l.format == KvFormat::fp8) {
        p.k_codes[t * d + c] = in[k_fp8_offset(k, t, c)];
        continue;
      }
      p.k_codes[t * d + c] = get_code(in, k_code_address(k, t, c));
      if (c % l.block == 0) p.k_scales[t * (d / l.block) + c / l.block] = in[k_scale_offset(k, t, c)];
    }
  p.k_g = l.format == KvFormat::mxfp4 ? 1.0f : scales[0];  // MXFP4: the page scale is a layout detail
  unpack_r_rows(in, l, r);
  return p;
}

void pack_bf16_latent_page(const float* c, const float* r, int tokens, const LatentPageLayout& l, uint8_t* out) {
  require(l.format == KvFormat::bf16, "pack_bf16_latent_page: not a BF16 latent layout");
  std::memset(out, 0, size_t(l.bytes));
  const PageLayout k = l.latent_part();
  for (int t = 0; t < tokens; ++t)
    for (int x = 0; x < l.latent_dim; ++x) {
      const uint16_t b = float_to_bf16_bits(c[t * l.latent_dim + x]);
      std::memcpy(out + bf16_k_offset(k, t, x), &b, 2);
    }
  pack_r_rows(r, tokens, l, out);
}

void unpack_bf16_latent_page(const uint8_t* in, const LatentPageLayout& l, float* c, float* r) {
  const PageLayout k = l.latent_part();
  for (int t = 0; t < kPage; ++t)
    for (int x = 0; x < l.latent_dim; ++x) {
      uint16_t b;
      std::memcpy(&b, in + bf16_k_offset(k, t, x), 2);
      c[t * l.latent_dim + x] = bf16_bits_to_float(b);
    }
  unpack_r_rows(in, l, r);
}

}  // namespace fp4kv::cache
