// A small safetensors reader: one file, or a directory of shards described by
// model.safetensors.index.json. Tensors are read on demand (plain file reads) and
// converted to float32; every header field is validated so that a truncated or corrupt
// file is a clear fp4kv::Error naming the file instead of garbage weights.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fp4kv::model {

enum class Dtype { bf16, f16, f32, i32 };

const char* dtype_name(Dtype dtype);  // "BF16", "F16", "F32", "I32"
int dtype_size(Dtype dtype);          // bytes per element

struct TensorInfo {
  Dtype dtype = Dtype::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section (after the header)
  std::string file;             // the file that holds it

  int64_t numel() const;
};

// "[a, b, c]": for error messages.
std::string shape_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  // Reads and validates the header; throws fp4kv::Error naming `path` on any problem.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;

  // The tensor's elements in row-major order as float32 (BF16/F16/F32 only).
  std::vector<float> read_f32(const std::string& name) const;
  // An I32 tensor as int32 (e.g. input_ids of reference activations).
  std::vector<int32_t> read_i32(const std::string& name) const;

 private:
  std::vector<uint8_t> read_bytes(const TensorInfo& info) const;

  std::string path_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, TensorInfo> tensors_;
};

// All weights of a checkpoint directory: `model.safetensors`, or the shards listed in
// `model.safetensors.index.json` (its weight_map). Tensor names are unique across shards.
class SafetensorsArchive {
 public:
  static SafetensorsArchive open_dir(const std::string& dir);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  std::vector<float> read_f32(const std::string& name) const;

 private:
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

}  // namespace fp4kv::model
