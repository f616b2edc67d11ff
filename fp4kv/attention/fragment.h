// Register-level pieces of the decode kernels that do not need a GPU to be checked: how a
// lane's cache words become FP16 MMA operands (FP4 expansion trick, E4M3/E8M0 block
// scales as FP16), where the kernels place a page's 16-byte chunks in shared memory, and
// which (row, column) each fragment register holds. Host and device, so the CPU tests
// (tests/attention/test_fragment.cpp) replay a lane's view of a packed page exactly.
#pragma once

#include <cstdint>

#include "fp4kv/cache/layout.h"
#include "fp4kv/core/fp4_as_fp8.h"
#include "fp4kv/core/host_device.h"
#include "fp4kv/core/minifloat.h"

namespace fp4kv::attention {

// ---- FP4 expansion -------------------------------------------------------------------
// x holds two E2M1 nibbles at bits 0-3 and 16-19 (other bits ignored). Returns the half2
// bit pattern whose halves are value * 2^-14 of those nibbles: s e1 e0 m -> FP16 bits
// (s << 15) | (e1 e0 m << 9). Exact: 0.5 becomes the subnormal 2^-15, 1..6 are normal.
FP4KV_HD uint32_t fp4x2_to_half2_bits(uint32_t x) {
  return ((x & 0x00080008u) << 12) | ((x & 0x00070007u) << 9);
}

// Register r (0..3) of the A fragment of one 16 x 16 tile from the lane's stored 32-bit FP4
// word (layout.h): low half from slot r, high half from slot r + 4. The reference form.
FP4KV_HD uint32_t fp4_word_to_a_reg_bits(uint32_t word, int r) {
  return fp4x2_to_half2_bits(cache::fp4_nibble_word(word) >> (4 * r));
}

// Byte permute (PTX prmt / __byte_perm): result byte i is byte (s >> 4i) & 7 of y:x.
FP4KV_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFFu) << (8 * i);
  return r;
#endif
}

// All four A registers of a lane's stored FP4 word at once, with the same bits as
// fp4_word_to_a_reg_bits(word, r) for r = 0..3 (9 integer operations). Byte i of the word
// holds slot 2i's sign at bit 7 and its e1 e0 m at bits 1..3, which is already the high
// byte of its FP16 half, and slot 2i + 1's e1 e0 m at bits 4..6 and its sign at bit 0
// (layout.h). First every code becomes the high byte of its FP16 half:
//   lo: byte i from slot 2i (one mask), hi: byte i from slot 2i + 1 (two shifts, a merge);
// then register r takes slot r as the high byte of its low half and slot r + 4 as the high
// byte of its high half (both low bytes zero): one byte permute from lo (r even) or hi.
FP4KV_HD void fp4_word_to_a_regs(uint32_t word, uint32_t (&a)[4]) {
  const uint32_t lo = word & 0x8E8E8E8Eu;
  const uint32_t hi = ((word >> 3) & 0x0E0E0E0Eu) | ((word << 7) & 0x80808080u);
  a[0] = byte_perm(lo, 0u, 0x2404u);  // slots 0, 4: bytes 0, 2 of lo -> bytes 1, 3
  a[1] = byte_perm(hi, 0u, 0x2404u);  // slots 1, 5
  a[2] = byte_perm(lo, 0u, 0x3414u);  // slots 2, 6: bytes 1, 3 of lo
  a[3] = byte_perm(hi, 0u, 0x3414u);  // slots 3, 7
}

// Twice the FP32 value of an E8M0 scale code, 2^(code - 126): the code plus one is the
// exponent field, a normal float for every code the quantizer writes (0..253: the MXFP4
// exponent is at least -127 and, floor(log2) of a finite float minus 2, at most 125; the
// search's one step up gives at most 126), so no code needs a case of its own (2^(code - 127)
// would be the subnormal 2^-127 for code 0).
// The factor 2 is exact and goes back in the page factor (MxFp4Page).
FP4KV_HD float e8m0_scale_value_x2(uint32_t code) { return bits_float((code + 1) << 23); }
// Both codes of a 16-bit scale pair (row r in the low byte, r + 8 in the high one; bits 16
// and up are ignored) at once: one add for the two, then a shift and a mask each.
FP4KV_HD void e8m0_pair_values_x2(uint32_t pair, float (&f)[2]) {
  constexpr uint32_t kOneInEachByte = 0x0101u, kFloatExponentField = 0x7F800000u;
  const uint32_t fields = pair + kOneInEachByte;  // no carry between the bytes: codes <= 253
  f[0] = bits_float((fields << 23) & kFloatExponentField);
  f[1] = bits_float((fields << 15) & kFloatExponentField);
}

// ---- Reading a page in shared memory (layout.h: parts stored part-major) ---------------
// Byte offset (in the stage) of 16-byte part `part` of lane `lane` of row group `rg`.
FP4KV_HD constexpr int code_part_offset(int rg, int part, int lane, int cpl) { return ((rg * cpl + part) * 32 + lane) * 16; }
// Byte offset (from the scale array) of the scales of rows (rg*16 + lane/4, + 8) for all
// `blocks` column blocks: 2 * blocks consecutive bytes, block b at 2b (row r) and 2b + 1 (r + 8).
FP4KV_HD constexpr int scale_row_offset(int rg, int lane, int blocks) { return (rg * 8 + lane / 4) * 2 * blocks; }

// The query operand Q^T (B of S^T = K Q^T, k = channel, n = column) in shared memory in
// fragment order: half index of (column col, channel c) with NT n-tiles.
FP4KV_HD constexpr int qfrag_half_index(int col, int c, int nt_count) {
  return ((((c / 16) * nt_count + col / 8) * 32 + (col % 8) * 4 + (c % 8) / 2) * 2 + (c % 16) / 8) * 2 + c % 2;
}
// The column of query term t (of T) of head h among NT column tiles. One term: column h. Two
// terms in one tile (G <= 4): columns 2h and 2h + 1, a thread's C fragment pair, so the
// thread joins them. Two terms in NT >= 2 tiles: term t takes tiles t NT / 2 .. (t + 1) NT /
// 2 - 1, head h column h of them, so a thread holds both terms of its heads in matching
// columns of two tiles: the heads of its P.V slots (no exchange between lanes).
FP4KV_HD constexpr int query_column(int h, int t, int T, int NT) {
  return T == 1 ? h : NT == 1 ? 2 * h + t : t * 4 * NT + h;
}
// P^T (B of O^T = V^T P^T, k = key, n = head) lives as [head][key] halves with row stride
// kPsStride; 32-bit word of register `reg` of lane `lane` for n-tile j and k-step ks.
inline constexpr int kPsStride = kPageTokens + 8;
FP4KV_HD constexpr int ps_word_index(int j, int lane, int ks, int reg) {
  return ((j * 8 + lane / 4) * kPsStride + ks * 16 + 8 * reg) / 2 + lane % 4;
}

// Fragment positions (PTX ISA, mma.m16n8k16 with 16-bit operands).
// A (16 x 16, row-major): register r of lane l holds (row, col) and (row, col + 1) with
FP4KV_HD constexpr int a_frag_row(int lane, int r) { return lane / 4 + 8 * (r % 2); }
FP4KV_HD constexpr int a_frag_col(int lane, int r) { return 2 * (lane % 4) + 8 * (r / 2); }
// B (16 x 8, "col"): register r of lane l holds (k, n) and (k + 1, n).
FP4KV_HD constexpr int b_frag_k(int lane, int r) { return 2 * (lane % 4) + 8 * r; }
FP4KV_HD constexpr int b_frag_n(int lane) { return lane / 4; }
// C (16 x 8, FP32): element e of lane l is (row, col).
FP4KV_HD constexpr int c_frag_row(int lane, int e) { return lane / 4 + 8 * (e / 2); }
FP4KV_HD constexpr int c_frag_col(int lane, int e) { return 2 * (lane % 4) + e % 2; }

// ---- FP4 codes as m16n8k32 E4M3 operands (docs/DESIGN.md "FP8 tensor cores for FP4 data") --
// The pages keep their m16n8k16 A-fragment order; a k32 step takes a lane's words of k-steps
// 2p and 2p + 1 as they are, and the contraction runs over the channels in the permuted
// order k32_position (channel c of the 32-channel step at k position k32_position(c)): lane
// (g, t) then holds, for rows g and g + 8, the k positions 4t .. 4t + 3 and 16 + 4t .. 16 +
// 4t + 3 the 8-bit fragment wants. Channels 0-15 stay in k 0-15 (an NVFP4 block is a k half).
FP4KV_HD constexpr int k32_position(int c) {
  const int x = c % 16;
  return 16 * (c / 16) + 4 * ((x % 8) / 2) + 2 * (x / 8) + x % 2;
}
FP4KV_HD constexpr int k32_channel(int k) {
  const int x = k % 16;
  return 16 * (k / 16) + 2 * (x / 4) + 8 * ((x % 4) / 2) + x % 2;
}

// The four A registers (E4M3 bytes, code x 2^-6) of the m16n8k32 fragment from a lane's FP4
// words in nibble form (cache::fp4_nibble_word of the stored words; a study of this route,
// not used by the kernels) of k-steps 2p (`even`) and 2p + 1 (`odd`): register 0 = row g,
// k 4t..4t+3 = slots 0, 4, 2, 6 of `even`; 1 = row g + 8: slots 1, 5, 3, 7; 2 and 3 the
// same of `odd`.
// Per word: the even slots (low nibbles) and odd slots (high nibbles) placed as E4M3 bytes
// in place (core/fp4_as_fp8.h), then one byte permute each.
FP4KV_HD void fp4_word_to_e4m3_regs(uint32_t word, uint32_t& row_lo, uint32_t& row_hi) {
  row_lo = byte_perm(low_nibbles_as_e4m3x4(word), 0u, 0x3120u);   // slots 0, 4, 2, 6
  row_hi = byte_perm(high_nibbles_as_e4m3x4(word), 0u, 0x3120u);  // slots 1, 5, 3, 7
}
FP4KV_HD void fp4_words_to_e4m3_a_regs(uint32_t even, uint32_t odd, uint32_t (&a)[4]) {
  fp4_word_to_e4m3_regs(even, a[0], a[1]);
  fp4_word_to_e4m3_regs(odd, a[2], a[3]);
}

// Fragment positions (PTX ISA, mma.m16n8k32 with 8-bit operands): byte i of A register r
// of lane l is (row, k); byte i of B register r is (k, n).
FP4KV_HD constexpr int a8_frag_row(int lane, int r) { return lane / 4 + 8 * (r % 2); }
FP4KV_HD constexpr int a8_frag_k(int lane, int r, int i) { return 4 * (lane % 4) + 16 * (r / 2) + i; }
FP4KV_HD constexpr int b8_frag_k(int lane, int r, int i) { return 4 * (lane % 4) + 16 * r + i; }
FP4KV_HD constexpr int b8_frag_n(int lane) { return lane / 4; }

}  // namespace fp4kv::attention
