// Hopper warpgroup MMA (wgmma, sm_90a) for BF16 operands: the 128-byte-swizzled shared-memory
// tile layout and its matrix descriptors, the fence / commit / wait protocol, and the two shapes
// the prefill kernel uses (prefill_wgmma.cuh). PTX ISA, "Asynchronous Warpgroup Level Matrix
// Multiply-Accumulate": a warpgroup is 4 consecutive warps starting at a warp index divisible
// by 4; its accumulator fragment is mma.sync's m16n8 C fragment per warp (warp w of the group
// holds rows 16w..16w+15) repeated over the n-tiles, and its register A fragment is mma.sync's
// m16n8k16 A fragment per warp, so the FlashAttention-2 register code (softmax, P packing)
// carries over unchanged.
//
// Layout (one owner: sw128_offset): a 64-element BF16 row slice is 128 bytes; 8 rows form a
// 1024-byte swizzle atom in which 16-byte chunk c of row r sits at chunk c ^ (r % 8). A tile
// of R rows x 128 channels is two such planes of R rows (channels 0-63, then 64-127), each
// plane 1024-byte aligned. The same bytes serve as a K-major operand (rows = M or N, channels =
// K: Q and K of S = Q K^T) and as an N-major one (rows = K, channels = N: V of O = P V).
#pragma once

#include <cstdint>

namespace fp4kv::attention::detail {

inline constexpr int kWarpgroupThreads = 128;  // 4 warps
inline constexpr int kSw128RowBytes = 128;     // one row slice of 64 BF16
inline constexpr int kSw128AtomBytes = 1024;   // 8 rows
inline constexpr int kMmaK = 16;               // BF16 elements (K) of one wgmma k-step
inline constexpr int kKStepsPerRow = kSw128RowBytes / (kMmaK * 2);  // k-steps in one 128-byte row slice
// The leading byte offset of a swizzled K-major operand: unused, encoded as 1 (16 bytes).
inline constexpr uint32_t kUnusedLeadingBytes = 16;

// Byte offset of 16-byte chunk `chunk` (0-15: channels 8 chunk ..) of row `row` in a tile of
// `rows` rows x 128 channels.
__device__ __forceinline__ uint32_t sw128_offset(int rows, int row, int chunk) {
  return uint32_t((chunk / 8) * rows * kSw128RowBytes + row * kSw128RowBytes + (((chunk % 8) ^ (row % 8)) << 4));
}

// The 64-bit shared-memory matrix descriptor: start address, leading and stride byte offsets
// (16-byte units, 14 bits each), 128-byte swizzle (mode 1 in bits 62-63).
__device__ __forceinline__ uint64_t sw128_descriptor(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return uint64_t((smem_addr & 0x3FFFFu) >> 4) | (uint64_t((leading_bytes & 0x3FFFFu) >> 4) << 16) |
         (uint64_t((stride_bytes & 0x3FFFFu) >> 4) << 32) | (uint64_t(1) << 62);
}

// K-major operand (Q or K) of a tile with `rows` rows, k-step ks (16 channels): the plane of
// channels 64 (ks / 4).., 32 bytes per k-step inside the swizzled row (the hardware applies the
// swizzle to the address bits, so the atom stays aligned); 8-row groups 1024 bytes apart (the
// leading offset is unused for swizzled K-major layouts: 1).
__device__ __forceinline__ uint64_t kmajor_descriptor(uint32_t tile, int rows, int ks) {
  return sw128_descriptor(
      tile + uint32_t((ks / kKStepsPerRow) * rows * kSw128RowBytes + (ks % kKStepsPerRow) * kMmaK * 2),
      kUnusedLeadingBytes, kSw128AtomBytes);
}

// N-major operand (V: rows = keys = K, channels = N) of a tile with `rows` keys, k-step kk (16
// keys): 16 rows further per k-step; 8-key groups 1024 bytes apart (stride offset), the next 64
// channels one plane further (leading offset).
__device__ __forceinline__ uint64_t nmajor_descriptor(uint32_t tile, int rows, int kk) {
  return sw128_descriptor(tile + uint32_t(kk * kMmaK * kSw128RowBytes), uint32_t(rows * kSw128RowBytes),
                          kSw128AtomBytes);
}

// Orders this thread's register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The accumulator operands of one n-tile (4 per thread) and of eight, for the asm statements
// below (each wgmma names every accumulator register).
#define FP4KV_WGMMA_ACC_TILE(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define FP4KV_WGMMA_ACC_8_TILES(d, j)                                                                        \
  FP4KV_WGMMA_ACC_TILE(d, j), FP4KV_WGMMA_ACC_TILE(d, j + 1), FP4KV_WGMMA_ACC_TILE(d, j + 2),                \
      FP4KV_WGMMA_ACC_TILE(d, j + 3), FP4KV_WGMMA_ACC_TILE(d, j + 4), FP4KV_WGMMA_ACC_TILE(d, j + 5),        \
      FP4KV_WGMMA_ACC_TILE(d, j + 6), FP4KV_WGMMA_ACC_TILE(d, j + 7)

// D (+)= A B for A = 64 x 16 and B = 16 x 64 BF16 tiles in shared memory (K-major descriptors),
// D in FP32 registers (the m64n64 accumulator fragment: d[j][e] is mma.sync's C fragment of
// n-tile j); accumulate = false ignores D's old value.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : FP4KV_WGMMA_ACC_8_TILES(d, 0)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
}

// D += A B for A = 64 x 16 BF16 in registers (the m64nNk16 A fragment: mma.sync's A fragment
// per warp, 4 per thread) and B = 16 x 128 BF16 in shared memory stored N-major (imm-trans-b =
// 1), D as in wgmma_m64n64k16_ss.
__device__ __forceinline__ void wgmma_m64n128k16_rs_nmajor(float (&d)[16][4], const uint32_t (&a)[4],
                                                          uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : FP4KV_WGMMA_ACC_8_TILES(d, 0), FP4KV_WGMMA_ACC_8_TILES(d, 8)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}

#undef FP4KV_WGMMA_ACC_8_TILES
#undef FP4KV_WGMMA_ACC_TILE

}  // namespace fp4kv::attention::detail
