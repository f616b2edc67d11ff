// The small-batch GEMM (gemv.h): two kernels with one CTA shape, lane-to-chunk map and order
// of sums, which differ only in where a CTA's W rows wait for X: in registers (gemv_kernel) or
// staged in shared memory by bulk copies (gemv_staged_kernel).
#include "fp4kv/ops/gemv.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "fp4kv/cache/bulk_copy.cuh"
#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/cache/dependent_launch.cuh"
#include "fp4kv/cache/once_per_device.h"
#include "fp4kv/core/error.h"
#include "fp4kv/ops/bf16x8.cuh"
#include "fp4kv/ops/swiglu.cuh"

namespace fp4kv::ops {

namespace {

constexpr int kWarps = 8;  // warps per CTA: kWarps / slices rows, each in `slices` k-slices
constexpr int kChunk = kBf16PerLoad;

// Registers: a lane's W loads are issued at once before the producer wait.
constexpr int kLoadsInFlight = 8;                    // W loads a lane issues before it uses any: 4 KiB per warp
constexpr int kChunksPerPass = 32 * kLoadsInFlight;  // 16-byte chunks a warp has in flight
constexpr int kMaxSlices = kWarps;
// The most chunks a slice may hold: 5 loads per lane. Measured on the H200 (bench gemm,
// Qwen3-4B shapes at batch 1, slices forced to 1/2/4/8): each shape was fastest with the
// fewest slices of at most 5 loads per lane (QKV and gate/up 2, O 4, down 8); fuller slices
// (8 loads) or more warps with less each were slower.
constexpr int kSliceChunks = 32 * 5;

// Staged: the CTA's W rows in shared memory, bulk-copied before the producer wait. Measured in
// the decode step (H100, docs/PERF.md "W staged in shared memory"): faster at 1-3 rows of X,
// slower at 4 (each of a lane's passes over its 8-19 staged chunks waits for that pass's X
// loads from L2; the register path has one pass of at most 5), the same at 8.
constexpr int kStagedMaxXRows = 3;
constexpr int kStagedCtaRows = 4;                  // W rows a CTA stages, halved while over kStagedCtaBytes
constexpr int kStagedCtaBytes = 40 << 10;          // (Qwen3-4B: O 4 rows of 8 KiB, down 2 of 19 KiB)
constexpr int kStagedMaxBytes = 96 << 10;          // a CTA's shared memory for W at most: larger k stays in registers
constexpr int kStagedChunksPerPass = 4;            // a lane's shared-memory W reads per pass
// CTAs an SM holds by registers (40 a thread at one row of X, else 64), without spills: the
// staged CTAs are many and small, so that more of W is in flight before the wait.
constexpr int staged_min_blocks(int m) { return m == 1 ? 6 : 4; }

// How a GEMV of m rows of X and k columns runs: the kernel and the rows of W per CTA (each
// cut into kWarps / cta_rows k-slices).
struct GemvLayout {
  bool staged = false;
  int cta_rows = 0;
  int smem_bytes = 0;  // the staged CTA's W rows
  int slices() const { return kWarps / cta_rows; }
};

GemvLayout gemv_layout(int m, int k) {
  const int row_bytes = k * int(sizeof(__nv_bfloat16));
  if (m <= kStagedMaxXRows && row_bytes <= kStagedMaxBytes) {
    int rows = kStagedCtaRows;
    while (rows > 1 && rows * row_bytes > kStagedCtaBytes) rows /= 2;
    return GemvLayout{true, rows, rows * row_bytes};
  }
  const int chunks = k / kChunk;
  int slices = 1;
  while (slices < kMaxSlices && (chunks + slices - 1) / slices > kSliceChunks) slices *= 2;
  return GemvLayout{false, kWarps / slices, 0};
}

// acc[m] += <W chunk, X[m] chunk> for every row m of X; xc points at row 0's chunk, row m's is
// `chunks` further per row.
template <int M>
__device__ __forceinline__ void accumulate_chunk(const uint4& w_chunk, const uint4* __restrict__ xc, int chunks,
                                                 float (&acc)[M]) {
  float wf[kChunk];
  bf16x8_to_float(w_chunk, wf);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[kChunk];
    bf16x8_to_float(__ldg(xc + size_t(m) * chunks), xf);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) acc[m] = fmaf(wf[i], xf[i], acc[m]);
  }
}

// Streaming loads of a lane's next chunks wp[0], wp[32], ... below `left` (W is read once: past
// the caches); the others are left as they are.
__device__ __forceinline__ void load_w(const uint4* __restrict__ wp, int left, uint4 (&wv)[kLoadsInFlight]) {
#pragma unroll
  for (int j = 0; j < kLoadsInFlight; ++j) {
    if (32 * j < left) wv[j] = __ldcs(wp + 32 * j);
  }
}

// What a GEMV writes: Y in BF16 or FP32, or the SwiGLU of its (gate, up) row pairs.
enum class GemvOut { bf16, f32, swiglu };

// The W row of a CTA's row v: v itself, or with the SwiGLU epilogue (W = [gate rows n / 2]
// [up rows n / 2]) gate row v / 2 for even v and up row n / 2 + v / 2 for odd v, so that a
// CTA's rows are whole (gate, up) pairs.
template <GemvOut Out>
__device__ __forceinline__ int weight_row(int v, int n) {
  if constexpr (Out == GemvOut::swiglu) return (v % 2) * (n / 2) + v / 2;
  else return v;
}

// A warp's share of its CTA's rows: the CTA's row `cta_row` (its rows are kWarps / slices
// consecutive rows from row0, `slices` warps each), W row `row`, k-slice `slice` of it, and
// its lane's chunks first, first + 32, ... below first + left (none for rows past n).
struct WarpSlice {
  int lane, warp, slice, cta_row, row0, row, chunks, first, left;
  __device__ __forceinline__ WarpSlice(int n, int k, int slices)
      : lane(threadIdx.x % 32), warp(threadIdx.x / 32), slice(warp % slices), cta_row(warp / slices),
        row0(blockIdx.x * (kWarps / slices)), row(row0 + cta_row), chunks(k / kChunk) {
    const int per_slice = (chunks + slices - 1) / slices;
    first = slice * per_slice + lane;
    left = row < n ? min(chunks - slice * per_slice, per_slice) - lane : 0;
  }
};

// X row m's dot product with W row `row`: its warps' partials (row-major in the CTA, one
// per slice) in slice order.
template <int M>
__device__ __forceinline__ float row_sum(const float (&partial)[kWarps][M], int first_warp, int slices, int m) {
  float sum = partial[first_warp][m];
  for (int s = 1; s < slices; ++s) sum += partial[first_warp + s][m];
  return sum;
}

// The end of a GEMV CTA: each warp's lane sums over the warp (a butterfly), the row's slices
// in slice order through shared memory (one barrier), and lane m of the row's first warp
// writes X row m's output (with the SwiGLU epilogue: the gate row's warps, from the gate and
// up sums).
template <int M, GemvOut Out>
__device__ __forceinline__ void finish_rows(float (&acc)[M], float (&partial)[kWarps][M], const WarpSlice& ws,
                                            int slices, int n, void* __restrict__ y) {
  const int warp = ws.warp, row = ws.row;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
  if (ws.lane == 0) {
#pragma unroll
    for (int m = 0; m < M; ++m) partial[warp][m] = acc[m];
  }
  __syncthreads();
  if (ws.slice != 0 || ws.lane >= M || row >= n) return;
  const int m = ws.lane;  // lane m writes X row m's output
  const float sum = row_sum<M>(partial, warp, slices, m);
  if constexpr (Out == GemvOut::f32) {
    static_cast<float*>(y)[size_t(m) * n + row] = sum;
  } else if constexpr (Out == GemvOut::bf16) {
    static_cast<__nv_bfloat16*>(y)[size_t(m) * n + row] = __float2bfloat16_rn(sum);
  } else {  // the gate row's warps write; its up row's are the next `slices` warps
    if (row % 2 != 0) return;
    const float up = row_sum<M>(partial, warp + slices, slices, m);
    static_cast<__nv_bfloat16*>(y)[size_t(m) * (n / 2) + row / 2] =
        swiglu_value(__float2bfloat16_rn(sum), __float2bfloat16_rn(up));
  }
}

// A CTA owns kWarps / slices consecutive rows (weight_row's order); each row is cut into
// `slices` equal k-slices of whole 16-byte chunks, one warp each, and a lane owns the chunks
// lane, lane + 32, ... of its slice. The host picks the fewest slices of at most
// kSliceChunks (gemv_layout), so at the decode step's shapes every weight load of the kernel
// is issued at once, before waiting for X, and the 2560-row matrices run as 1280 or 2560
// small CTAs instead of 320 of 8 rows (which left a third of the SMs a CTA short). Sums: per
// lane in k order, a butterfly over the warp, then the row's slices in slice order through
// shared memory: a fixed order. Launched as a programmatic dependent of the op that writes X:
// the first pass's W loads are issued before waiting for it (W depends on nothing), X is read
// and Y written only after.
template <int M, GemvOut Out>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w, void* __restrict__ y, int n,
                int k, int slices) {
  __shared__ float partial[kWarps][M];
  cache::allow_dependents();  // the next op (a norm, SwiGLU, QK-norm + RoPE, the down GEMV) may set up its grid
  const WarpSlice ws(n, k, slices);
  const uint4* wp =
      reinterpret_cast<const uint4*>(w + size_t(ws.row < n ? weight_row<Out>(ws.row, n) : 0) * k) + ws.first;
  const uint4* xp = reinterpret_cast<const uint4*>(x) + ws.first;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  uint4 wv[kLoadsInFlight];
  load_w(wp, ws.left, wv);
  cache::wait_for_producer();
  for (int done = 0; done < ws.left; done += kChunksPerPass) {
    if (done != 0) load_w(wp + done, ws.left - done, wv);
#pragma unroll
    for (int j = 0; j < kLoadsInFlight; ++j) {
      if (done + 32 * j < ws.left) accumulate_chunk<M>(wv[j], xp + done + 32 * j, ws.chunks, acc);
    }
  }
  finish_rows<M, Out>(acc, partial, ws, slices, n, y);
}

// ---- W staged in shared memory ---------------------------------------------------------------

// The GEMV with the CTA's W rows staged in shared memory: thread 0 issues one bulk copy per
// row, each completing on the row's own mbarrier, before the producer wait, so the CTA's whole
// share of W is in flight while the ops before it run, however many registers that would take
// (a CTA holds up to 40 KiB of W; with 40 registers a thread six fit an SM beside the
// attention's CTAs, against four CTAs of 20 KiB in registers). After the wait each warp waits
// for its row only, then reads its chunks from shared memory: the same lanes, chunks, order of
// sums and epilogue as gemv_kernel, so for the same slices the same bits.
template <int M, GemvOut Out>
__global__ void __launch_bounds__(kWarps * 32, staged_min_blocks(M))
    gemv_staged_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                       void* __restrict__ y, int n, int k, int slices) {
  extern __shared__ __align__(128) uint4 w_rows[];  // [kWarps / slices][k / kChunk]
  __shared__ float partial[kWarps][M];
  __shared__ __align__(8) uint64_t row_landed[kWarps];  // one mbarrier per staged row
  cache::allow_dependents();
  const WarpSlice ws(n, k, slices);
  if (threadIdx.x == 0) {
    const int rows_here = min(kWarps / slices, n - ws.row0);
    for (int r = 0; r < rows_here; ++r) cache::mbar_init(cache::smem_u32(&row_landed[r]), 1);
    cache::mbar_init_fence();
    for (int r = 0; r < rows_here; ++r)
      cache::bulk_copy_to_shared_evict_first(cache::smem_u32(w_rows + r * ws.chunks),
                                             w + size_t(weight_row<Out>(ws.row0 + r, n)) * k, ws.chunks * 16,
                                             cache::smem_u32(&row_landed[r]));
  }
  __syncthreads();  // the mbarriers are initialized before anyone waits on them
  const uint4* wp = w_rows + ws.cta_row * ws.chunks + ws.first;
  const uint4* xp = reinterpret_cast<const uint4*>(x) + ws.first;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  cache::wait_for_producer();
  if (ws.row < n) cache::mbar_wait(cache::smem_u32(&row_landed[ws.cta_row]), 0);
  for (int done = 0; done < ws.left; done += 32 * kStagedChunksPerPass) {
    uint4 wv[kStagedChunksPerPass];
#pragma unroll
    for (int j = 0; j < kStagedChunksPerPass; ++j) {
      if (done + 32 * j < ws.left) wv[j] = wp[done + 32 * j];
    }
#pragma unroll
    for (int j = 0; j < kStagedChunksPerPass; ++j) {
      if (done + 32 * j < ws.left) accumulate_chunk<M>(wv[j], xp + done + 32 * j, ws.chunks, acc);
    }
  }
  finish_rows<M, Out>(acc, partial, ws, slices, n, y);
}

// The staged kernel's shared memory past the default 48 KiB: a per-device kernel attribute,
// which a stream capture cannot set, so gemv_prepare sets it ahead of any capture (and an eager
// launch on first use).
constexpr int kDefaultDynamicSmem = 48 << 10;
template <int M, GemvOut Out>
cudaError_t allow_staged_smem() {
  return cudaFuncSetAttribute(gemv_staged_kernel<M, Out>, cudaFuncAttributeMaxDynamicSharedMemorySize, kStagedMaxBytes);
}
template <int M, GemvOut Out>
void reserve_staged_smem() {
  cache::cuda_check(cache::once_per_device<allow_staged_smem<M, Out>>(), "gemv: reserve shared memory");
}
template <int M>
void reserve_staged_smem_all_outputs() {
  reserve_staged_smem<M, GemvOut::bf16>();
  reserve_staged_smem<M, GemvOut::f32>();
  reserve_staged_smem<M, GemvOut::swiglu>();
}

template <int M, GemvOut Out>
void launch_rows(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, int n, int k, cudaStream_t stream) {
  const GemvLayout g = gemv_layout(M, k);
  const dim3 grid((n + g.cta_rows - 1) / g.cta_rows), block(kWarps * 32);
  if constexpr (M <= kStagedMaxXRows) {
    if (g.staged) {
      if (g.smem_bytes > kDefaultDynamicSmem) reserve_staged_smem<M, Out>();
      cache::launch_dependent(gemv_staged_kernel<M, Out>, grid, block, size_t(g.smem_bytes), stream, x, w, y, n, k,
                              g.slices());
      return;
    }
  }
  cache::launch_dependent(gemv_kernel<M, Out>, grid, block, 0, stream, x, w, y, n, k, g.slices());
}

// The launch for X of m rows (1 <= m <= kGemvMaxRows; others launch nothing).
template <GemvOut Out>
void launch(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, int m, int n, int k, cudaStream_t stream) {
  switch (m) {
    case 1: launch_rows<1, Out>(x, w, y, n, k, stream); break;
    case 2: launch_rows<2, Out>(x, w, y, n, k, stream); break;
    case 3: launch_rows<3, Out>(x, w, y, n, k, stream); break;
    case 4: launch_rows<4, Out>(x, w, y, n, k, stream); break;
    case 5: launch_rows<5, Out>(x, w, y, n, k, stream); break;
    case 6: launch_rows<6, Out>(x, w, y, n, k, stream); break;
    case 7: launch_rows<7, Out>(x, w, y, n, k, stream); break;
    case 8: launch_rows<8, Out>(x, w, y, n, k, stream); break;
    default: return;  // gemv_supports is the caller's check
  }
  cache::cuda_check_launch("gemv");
}

}  // namespace

int gemv_cta_rows(int m, int k) { return gemv_layout(m, k).cta_rows; }

bool gemv_stages_weights(int m, int k) { return gemv_layout(m, k).staged; }

void gemv_prepare(int m, int k) {
  const GemvLayout g = gemv_layout(m, k);
  if (!g.staged || g.smem_bytes <= kDefaultDynamicSmem) return;
  static_assert(kStagedMaxXRows == 3, "one case per staged row count of X");
  switch (m) {
    case 1: reserve_staged_smem_all_outputs<1>(); break;
    case 2: reserve_staged_smem_all_outputs<2>(); break;
    case 3: reserve_staged_smem_all_outputs<3>(); break;
    default: break;
  }
}

bool gemv_supports(int m, int k) { return m >= 1 && m <= kGemvMaxRows && k > 0 && k % kGemvKMultiple == 0; }

bool gemv_swiglu_supports(int m, int k) { return gemv_supports(m, k) && gemv_cta_rows(m, k) % 2 == 0; }

void gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool f32_out, int m, int n, int k,
          cudaStream_t stream) {
  if (f32_out) launch<GemvOut::f32>(x, w, y, m, n, k, stream);
  else launch<GemvOut::bf16>(x, w, y, m, n, k, stream);
}

void gemv_swiglu(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, __nv_bfloat16* act, int m, int intermediate,
                 int k, cudaStream_t stream) {
  require(gemv_swiglu_supports(m, k) && intermediate > 0,
          "gemv_swiglu: " + std::to_string(m) + " rows, k " + std::to_string(k) + ", intermediate " +
              std::to_string(intermediate) + " is not a shape it takes (gemv_swiglu_supports)");
  launch<GemvOut::swiglu>(x, w_gate_up, act, m, 2 * intermediate, k, stream);
}

}  // namespace fp4kv::ops
