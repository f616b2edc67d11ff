// Lookup of the decode and combine instances, generated from the one instance list.
#include "fp4kv/attention/kernel_registry.h"

#include "fp4kv/attention/device_common.cuh"
#include "fp4kv/attention/kernel_instances.h"
#include "fp4kv/attention/page_traits.cuh"

namespace fp4kv::attention::detail {

namespace {

struct Entry {
  KvFormat format;
  int head_dim;
  OperandMode mode;
  int column_tiles;
  DecodeKernel kernel;
};

#define FP4KV_REGISTRY_ENTRY(FMT, D, MODE, NT)                                                        \
  Entry{FMT::kFormat, D, MODE, NT,                                                                  \
        DecodeKernel{configure_decode<FMT, D, MODE, NT>, decode_smem_bytes<FMT, D, MODE, NT>,         \
                     decode_occupancy<FMT, D, MODE, NT>, launch_decode<FMT, D, MODE, NT>}},
const Entry kEntries[] = {FP4KV_DECODE_INSTANCES(FP4KV_REGISTRY_ENTRY)};
#undef FP4KV_REGISTRY_ENTRY

}  // namespace

DecodeKernel find_decode_kernel(KvFormat format, int head_dim, OperandMode mode, int column_tiles) {
  for (const Entry& e : kEntries)
    if (e.format == format && e.head_dim == head_dim && e.mode == mode && e.column_tiles == column_tiles)
      return e.kernel;
  return {};
}

CombineLaunch find_combine_kernel(int head_dim, IoType io) {
#define FP4KV_COMBINE_CASE(D) \
  if (head_dim == D) return io == IoType::bf16 ? launch_combine<D, IoType::bf16> : launch_combine<D, IoType::f32>;
  FP4KV_COMBINE_HEAD_DIMS(FP4KV_COMBINE_CASE)
#undef FP4KV_COMBINE_CASE
  return nullptr;
}

OperandMode operand_mode(const Recipe& r) {
  return r.query == QueryFormat::dual_fp4 ? kOmDual : r.query == QueryFormat::fp4 ? kOmFp4 : kOm16;
}

int column_tiles(const Recipe& r, int G) {
  const int cols = query_terms(operand_mode(r)) * G;
  return cols <= 8 ? 1 : cols <= 16 ? 2 : 4;
}

}  // namespace fp4kv::attention::detail
