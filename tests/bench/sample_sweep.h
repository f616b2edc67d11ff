// A small hand-written decode sweep in the JSON schema `fp4kv bench decode` writes: one
// shape, presets bf16 and nvfp4, contexts 4K and 128K, batch 8; the nvfp4 point at 128K was
// skipped, and only the 4K points carry PyTorch SDPA times.
#pragma once

namespace fp4kv::test {

inline constexpr const char* kSampleSweep = R"({
 "date": "2026-12-01", "device": "Test GPU", "sms": 132, "read_tbs": 4.5, "copy_tbs": 4.0, "runs": 15,
 "points": [
  {"shape": "qwen3-4b", "preset": "bf16", "context": 4096, "batch": 8, "us": 100.0, "kv_bytes": 450000000.0,
   "tbs": 4.5, "read_fraction": 1.0, "x_bf16": 1.0, "splits": 4, "copies": 10, "sdpa_us": 120.0, "x_sdpa": 1.2},
  {"shape": "qwen3-4b", "preset": "nvfp4", "context": 4096, "batch": 8, "us": 40.0, "kv_bytes": 126000000.0,
   "tbs": 3.15, "read_fraction": 0.7, "x_bf16": 2.5, "splits": 8, "copies": 30, "sdpa_us": 120.0, "x_sdpa": 3.0},
  {"shape": "qwen3-4b", "preset": "bf16", "context": 131072, "batch": 8, "us": 3200.0, "kv_bytes": 14400000000.0,
   "tbs": 4.5, "read_fraction": 1.0, "x_bf16": 1.0, "splits": 16, "copies": 1},
  {"shape": "qwen3-4b", "preset": "nvfp4", "context": 131072, "batch": 8,
   "skipped": "skipped: needs 200.0 GB, 140.0 GB free"}
 ]
}
)";

}  // namespace fp4kv::test
