// Built only when the installed fp4kv has the CUDA layers: the attention header compiles in
// a plain C++ translation unit and its host functions link.
#include "fp4kv/attention/decode.h"

#include "fp4kv/core/recipe.h"

int consumer_pages_per_split() {
  // 64 pages, 2 rows (batch 1 x 2 KV heads), about 8 CTAs wanted: 4 splits of 16 pages.
  return fp4kv::attention::choose_pages_per_split(64, 1, 2, 16, 8, 4);
}

int consumer_attended_pages() {
  // A BF16 cache attends every page a 300-token row touches: 3.
  return fp4kv::attention::attended_pages(300, fp4kv::parse_recipe("bf16"));
}
