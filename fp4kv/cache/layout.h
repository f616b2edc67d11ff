// The byte layout of the paged KV cache (SPEC section 5). This header is the only place
// that knows it: the cache kernels write it, the decode kernels read it, the host API
// and the tests pack/unpack through it.
//
// Pool: per layer, `num_blocks` cache blocks. A block holds one 128-token page of every KV
// head of its layer; head h's part starts at h * head_bytes. Inside a head's part, each
// sub-array starts on a 128-byte boundary:
//
//   NVFP4 / MXFP4:  [K codes][K scales][V codes][V scales][page scales: float k_g, v_g]
//   FP8:            [K codes][V codes][page scales: float k_scale, v_scale]
//   BF16:           [K: 128 x d bf16, row-major][V: 128 x d bf16, row-major]
//
// Codes are stored in mma.sync.m16n8k16 A-fragment order, so a lane loads the codes of its
// fragment with wide loads and expands them in registers:
//   K is the A operand of S^T = K Q^T: rows = 16 keys ("key group" kg = t / 16), columns
//     = 16 channels (k-step ks = c / 16).
//   V is the A operand of O^T = V^T P^T: rows = 16 channels (cg = c / 16), columns = 16
//     keys (k-step ks = t / 16; 8 k-steps per page).
// For a 16 x 16 A tile, element (row, col) belongs to lane = (row % 8) * 4 + (col % 8) / 2
// as fragment element j = (col / 8) * 4 + (row / 8) * 2 + col % 2 (a0..a7 of the PTX ISA
// fragment figure). FP4: the 8 elements of (lane, tile) are one 32-bit word; element j has
// slot (j % 2) * 4 + j / 2, so half2 register r = j / 2 takes its low element from slot r
// and its high element from slot r + 4. Byte i of the word holds slots 2i ("even") and
// 2i + 1 ("odd"), with their bits where the expansion to FP16 wants them rather than as two
// whole nibbles (fp4_stored_word below): bit 7 the even code's sign, bits 1-3 its e1 e0 m
// (the high byte of its FP16 half after one mask), bits 4-6 the odd code's e1 e0 m and
// bit 0 its sign. FP8: the 8 elements are 8 bytes in j order. A lane's codes come in
// 16-byte parts (FP4: 4 k-steps, FP8: 2 k-steps), and the parts are stored part-major
// inside a 16-row group: part p of all 32 lanes is 512 contiguous bytes. The decode kernel
// copies a page to shared memory as one contiguous block (cp.async.bulk) and a warp's
// 16-byte loads of one part are then free of bank conflicts:
//   FP4 word index  = ((tile_row_group * ksteps / 4 + ks / 4) * 32 + lane) * 4 + ks % 4
//   FP8 byte offset = (((tile_row_group * ksteps / 2 + ks / 2) * 32 + lane) * 2 + ks % 2) * 8 + j
// (ksteps = d/16 for K, 8 for V; both are multiples of 4 for d in {64, 128, 256}.)
//
// Block scales (E4M3 for NVFP4, E8M0 for MXFP4), one per (row, block of B along the
// columns): [row group][row % 8][block][row / 8], so the 4 lanes sharing row % 8 read the
// scales of their two rows for every block as consecutive bytes.
//
// Page scales: NVFP4 k_g / v_g are the FP32 global scales g = amax / 2688 of the slice.
// MXFP4 has no g; its page scale is the power of two 2^(emax - 15), emax the largest block
// exponent (code - 127) of the slice: the range of the page's block scales, for tools. The
// decode kernel applies MXFP4 block scales in FP32 and does not read it (docs/DESIGN.md).
// FP8: the slice scale amax / 448.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv::cache {

inline constexpr int kPage = kPageTokens;  // 128
inline constexpr int kAlign = 128;

FP4KV_HD constexpr int align_up(int x, int a = kAlign) { return (x + a - 1) / a * a; }

// Byte offsets of one KV head's part of a cache block.
struct PageLayout {
  KvFormat format = KvFormat::nvfp4;
  int head_dim = 0;
  int block = 0;  // microscaling block size (16, 32) or 0
  int k_codes = 0, k_scales = 0, v_codes = 0, v_scales = 0, page_scales = 0;
  int bytes = 0;  // size of one head's part (multiple of 128)

  FP4KV_HD static constexpr PageLayout make(KvFormat f, int d) {
    PageLayout l;
    l.format = f;
    l.head_dim = d;
    int off = 0;
    if (f == KvFormat::nvfp4 || f == KvFormat::mxfp4) {
      l.block = f == KvFormat::nvfp4 ? 16 : 32;
      l.k_codes = off;
      off = align_up(off + kPage * d / 2);
      l.k_scales = off;
      off = align_up(off + kPage * (d / l.block));
      l.v_codes = off;
      off = align_up(off + d * kPage / 2);
      l.v_scales = off;
      off = align_up(off + d * (kPage / l.block));
      l.page_scales = off;
      off = align_up(off + 8);
    } else if (f == KvFormat::fp8) {
      l.k_codes = off;
      off = align_up(off + kPage * d);
      l.v_codes = off;
      off = align_up(off + kPage * d);
      l.page_scales = off;
      off = align_up(off + 8);
    } else {  // bf16
      l.k_codes = off;
      off = align_up(off + kPage * d * 2);
      l.v_codes = off;
      off = align_up(off + kPage * d * 2);
    }
    l.bytes = off;
    return l;
  }
};

// Which formats and head sizes the GPU cache supports.
FP4KV_HD constexpr bool gpu_format_supported(KvFormat f) {
  return f == KvFormat::nvfp4 || f == KvFormat::mxfp4 || f == KvFormat::fp8 || f == KvFormat::bf16;
}
FP4KV_HD constexpr bool gpu_head_dim_supported(int d) { return d == 64 || d == 128 || d == 256; }

// ---- Fragment addressing ---------------------------------------------------------------

// Position of element (row, col) of a 16 x 16 A tile.
struct FragmentSlot {
  int lane;  // 0..31
  int j;     // fragment element a0..a7
};
FP4KV_HD constexpr FragmentSlot fragment_slot(int row, int col) {
  return FragmentSlot{(row % 8) * 4 + (col % 8) / 2, (col / 8) * 4 + (row / 8) * 2 + col % 2};
}
// Slot (0..7) of fragment element j within its lane's 32-bit FP4 word.
FP4KV_HD constexpr int fp4_word_slot(int j) { return (j % 2) * 4 + j / 2; }

// A word of four stored FP4 bytes from "nibble form" (byte i = even code in the low nibble,
// odd code in the high one: how the writers assemble words), and back. Only these two
// functions know where a code's bits sit in a byte; the byte forms below are built on them.
FP4KV_HD constexpr uint32_t fp4_stored_word(uint32_t nibbles) {
  return ((nibbles & 0x07070707u) << 1) | ((nibbles & 0x08080808u) << 4) | (nibbles & 0x70707070u) |
         ((nibbles & 0x80808080u) >> 7);
}
FP4KV_HD constexpr uint32_t fp4_nibble_word(uint32_t stored) {
  return ((stored >> 1) & 0x07070707u) | ((stored >> 4) & 0x08080808u) | (stored & 0x70707070u) |
         ((stored & 0x01010101u) << 7);
}
// A stored FP4 byte from its even and odd codes (s e1 e0 m, 4 bits each), and back.
FP4KV_HD constexpr uint8_t fp4_stored_byte(uint32_t even, uint32_t odd) {
  return uint8_t(fp4_stored_word((even & 0xFu) | ((odd & 0xFu) << 4)));
}
FP4KV_HD constexpr uint8_t fp4_code_of_stored(uint8_t byte, int odd) {
  return uint8_t((fp4_nibble_word(byte) >> (4 * odd)) & 0xFu);
}

// Byte offset (from the codes sub-array) of an FP4 element of an A operand with `rows` x
// `cols` logical shape tiled 16 x 16 (K: rows = 128 keys, cols = d channels; V^T: rows = d
// channels, cols = 128 keys), and whether it is the byte's even (0) or odd (1) code.
struct CodeAddress {
  int byte;
  int odd;
};
FP4KV_HD constexpr CodeAddress fp4_code_address(int row, int col, int cols) {
  const FragmentSlot s = fragment_slot(row % 16, col % 16);
  const int ksteps = cols / 16;
  const int ks = col / 16;
  const int word = (((row / 16) * (ksteps / 4) + ks / 4) * 32 + s.lane) * 4 + ks % 4;
  const int slot = fp4_word_slot(s.j);
  return CodeAddress{word * 4 + slot / 2, slot % 2};
}
FP4KV_HD constexpr int fp8_code_offset(int row, int col, int cols) {
  const FragmentSlot s = fragment_slot(row % 16, col % 16);
  const int ks = col / 16;
  return ((((row / 16) * (cols / 32) + ks / 2) * 32 + s.lane) * 2 + ks % 2) * 8 + s.j;
}
// Byte offset (from the scales sub-array) of the scale of (row, column block `blk`), with
// `blocks` scale blocks per row.
FP4KV_HD constexpr int scale_offset(int row, int blk, int blocks) {
  return (((row / 16) * 8 + row % 8) * blocks + blk) * 2 + (row % 16) / 8;
}

// K element (token t, channel c) and V element (token t, channel c) of one head's part.
FP4KV_HD constexpr CodeAddress k_code_address(const PageLayout& l, int t, int c) {
  CodeAddress a = fp4_code_address(t, c, l.head_dim);
  a.byte += l.k_codes;
  return a;
}
FP4KV_HD constexpr CodeAddress v_code_address(const PageLayout& l, int t, int c) {
  CodeAddress a = fp4_code_address(c, t, kPage);
  a.byte += l.v_codes;
  return a;
}
FP4KV_HD constexpr int k_scale_offset(const PageLayout& l, int t, int c) {
  return l.k_scales + scale_offset(t, c / l.block, l.head_dim / l.block);
}
FP4KV_HD constexpr int v_scale_offset(const PageLayout& l, int t, int c) {
  return l.v_scales + scale_offset(c, t / l.block, kPage / l.block);
}
FP4KV_HD constexpr int k_fp8_offset(const PageLayout& l, int t, int c) { return l.k_codes + fp8_code_offset(t, c, l.head_dim); }
FP4KV_HD constexpr int v_fp8_offset(const PageLayout& l, int t, int c) { return l.v_codes + fp8_code_offset(c, t, kPage); }
FP4KV_HD constexpr int bf16_k_offset(const PageLayout& l, int t, int c) { return l.k_codes + (t * l.head_dim + c) * 2; }
FP4KV_HD constexpr int bf16_v_offset(const PageLayout& l, int t, int c) { return l.v_codes + (t * l.head_dim + c) * 2; }

// ---- The MLA latent page (docs/DESIGN.md "MLA") ---------------------------------------------
// One 128-token page of one layer's latent cache:
//   NVFP4 / MXFP4:  [c codes][c scales][r rows][page scales: float g, unused]
//   FP8:            [c codes][r rows][page scales: float slice scale, unused]
//   BF16:           [c: 128 x latent_dim bf16, row-major][r rows]
// The latent c' is in the key layout above at d = latent_dim (the score product reads it as
// the GQA kernels read K; the context product transposes its expanded fragments in registers);
// r rows: the BF16 positional keys [128][rope_dim], row-major. Each sub-array starts on a
// 128-byte boundary.
inline constexpr int kMlaLatentDim = 512;  // d_c: the latent sizes the GPU path supports (DeepSeek-V2/V3)
inline constexpr int kMlaRopeDim = 64;     // d_r

struct LatentPageLayout {
  KvFormat format = KvFormat::nvfp4;
  int latent_dim = 0, rope_dim = 0;
  int block = 0;  // microscaling block size (16, 32) or 0
  int c_codes = 0, c_scales = 0, r_rows = 0, page_scales = 0;
  int bytes = 0;  // one page (multiple of 128)

  FP4KV_HD static constexpr LatentPageLayout make(KvFormat f, int latent_dim, int rope_dim) {
    LatentPageLayout l;
    l.format = f;
    l.latent_dim = latent_dim;
    l.rope_dim = rope_dim;
    int off = 0;
    l.c_codes = off;
    if (f == KvFormat::nvfp4 || f == KvFormat::mxfp4) {
      l.block = f == KvFormat::nvfp4 ? 16 : 32;
      off = align_up(off + kPage * latent_dim / 2);
      l.c_scales = off;
      off = align_up(off + kPage * (latent_dim / l.block));
    } else {
      off = align_up(off + kPage * latent_dim * (f == KvFormat::fp8 ? 1 : 2));
      l.c_scales = off;
    }
    l.r_rows = off;
    off = align_up(off + kPage * rope_dim * 2);
    l.page_scales = off;
    if (f != KvFormat::bf16) off = align_up(off + 8);
    l.bytes = off;
    return l;
  }
  // The latent part as a key layout, for the key address functions above (k_code_address,
  // k_scale_offset, k_fp8_offset, bf16_k_offset at head_dim = latent_dim).
  FP4KV_HD constexpr PageLayout latent_part() const {
    PageLayout k;
    k.format = format;
    k.head_dim = latent_dim;
    k.block = block;
    k.k_codes = c_codes;
    k.k_scales = c_scales;
    k.page_scales = page_scales;
    k.bytes = bytes;
    return k;
  }
};
FP4KV_HD constexpr int latent_r_offset(const LatentPageLayout& l, int t, int c) { return l.r_rows + (t * l.rope_dim + c) * 2; }

// ---- The BF16 slot buffer -----------------------------------------------------------------
// Per running request ("slot"), per layer and KV head: 16 sink rows then 128 recent rows of
// d BF16 values, for transformed K' and for V: [layers][slots][kv_heads][2 (K, V)][144][d].
// Token t of the unfinished page lives in recent row t % 128.
inline constexpr int kSlotRows = kSinkTokens + kPage;  // 144
FP4KV_HD constexpr long slot_row_offset(int layer, int slot, int head, int kv, int row, int slots, int heads, int d) {
  return ((((long(layer) * slots + slot) * heads + head) * 2 + kv) * kSlotRows + row) * long(d);
}

// The latent cache's BF16 slot rows: per running request ("slot") and layer, 16 sink rows then
// 128 recent rows (token t of the unfinished page in recent row t % 128), each the BF16
// transformed latent c' [latent_dim] followed by the positional key r [rope_dim]:
// [layers][slots][144][latent_dim + rope_dim], in BF16 elements.
FP4KV_HD constexpr long latent_slot_row_offset(int layer, int slot, int row, int slots, int latent_dim, int rope_dim) {
  return ((long(layer) * slots + slot) * kSlotRows + row) * long(latent_dim + rope_dim);
}

}  // namespace fp4kv::cache
