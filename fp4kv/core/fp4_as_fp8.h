// E2M1 (FP4) codes as E4M3 (FP8) bytes: the bit placement an FP8 tensor-core path over FP4
// cache data starts from (an FP8 MMA has k = 32 and twice the FP16 rate). A code s|e1 e0|m
// becomes the byte s|0 0 e1 e0|m 0 0 (sign to bit 7, the three magnitude bits to bits 4..2), and then
//   e4m3(byte) = e2m1(code) * 2^-6   exactly, for all 16 codes:
// a normal code (e1 e0 = E >= 1) is 2^(E-1) (1 + m/2) and its byte 2^(E-7) (1 + m/2); a
// subnormal code (E = 0) is m/2 and its byte the E4M3 subnormal 2^-6 (4m/8). The product of
// two such operands carries 2^-12, applied in FP32 with the block scales; each product of two
// E2M1 values has at most 4 significant bits, so it is exact in any FP32 accumulator.
#pragma once

#include <cstdint>

#include "fp4kv/core/host_device.h"

namespace fp4kv {

inline constexpr int kFp4AsFp8Exponent = -6;  // e4m3(e2m1_as_e4m3(c)) = e2m1(c) * 2^kFp4AsFp8Exponent

FP4KV_HD constexpr uint8_t e2m1_as_e4m3(uint8_t code) {
  return uint8_t(((code & 0x8u) << 4) | ((code & 0x7u) << 2));
}

// The placement applied to the four bytes of a word at once: byte i from the low nibble of
// byte i (high nibbles ignored), or from its high nibble (the sign already at bit 7).
FP4KV_HD constexpr uint32_t low_nibbles_as_e4m3x4(uint32_t w) { return ((w & 0x08080808u) << 4) | ((w & 0x07070707u) << 2); }
FP4KV_HD constexpr uint32_t high_nibbles_as_e4m3x4(uint32_t w) { return (w & 0x80808080u) | ((w & 0x70707070u) >> 2); }

// Four codes, nibbles 0..3 of `codes` (low nibble first), as four E4M3 bytes (byte i from
// nibble i): the word-wide form a kernel applies to a register of packed codes.
FP4KV_HD constexpr uint32_t e2m1x4_as_e4m3x4(uint32_t codes) {
  const uint32_t spread = (codes & 0xFu) | ((codes & 0xF0u) << 4) | ((codes & 0xF00u) << 8) | ((codes & 0xF000u) << 12);
  return low_nibbles_as_e4m3x4(spread);
}

}  // namespace fp4kv
