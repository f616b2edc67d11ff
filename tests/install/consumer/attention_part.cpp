// Built only when the installed fp4kv has the CUDA layers: the attention header compiles in
// a plain C++ translation unit and its host functions link (no GPU code runs).
#include <string>

#include "fp4kv/attention/decode.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"

int consumer_attended_pages() {
  // A BF16 cache attends every page a 300-token row touches: 3.
  return fp4kv::cache::attended_pages(300, fp4kv::parse_recipe("bf16"));
}

// DecodeAttention validates a plan before any CUDA call: Qwen3-4B's shape is supported,
// head_dim 96 is refused with a message naming it.
bool consumer_decode_checks() {
  const fp4kv::Recipe r = fp4kv::parse_recipe("nvfp4");
  const fp4kv::attention::DecodeCapacity cap{8, 64, 16};
  fp4kv::attention::DecodeAttention::check_supported({32, 8, 128}, r, cap);
  try {
    fp4kv::attention::DecodeAttention::check_supported({32, 8, 96}, r, cap);
  } catch (const fp4kv::Error& e) {
    return std::string(e.what()).find("96") != std::string::npos;
  }
  return false;
}
