#include "fp4kv/model/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "fp4kv/core/error.h"
#include "fp4kv/core/half.h"

namespace fp4kv::model {

// Tensor bytes are little-endian; the conversions below copy them as host words.
static_assert(std::endian::native == std::endian::little, "fp4kv::model assumes a little-endian host");

namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the limit of the reference implementation

bool parse_dtype(const std::string& s, Dtype* out) {
  if (s == "BF16") *out = Dtype::bf16;
  else if (s == "F16") *out = Dtype::f16;
  else if (s == "F32") *out = Dtype::f32;
  else if (s == "I32") *out = Dtype::i32;
  else return false;
  return true;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("safetensors file " + path + ": " + what);
}

}  // namespace

const char* dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::bf16: return "BF16";
    case Dtype::f16: return "F16";
    case Dtype::f32: return "F32";
    case Dtype::i32: return "I32";
  }
  return "?";
}

int dtype_size(Dtype dtype) { return dtype == Dtype::bf16 || dtype == Dtype::f16 ? 2 : 4; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // A directory opens as a stream on Linux and then reads as garbage sizes: refuse it first.
  if (std::filesystem::is_directory(path)) fail(path, "is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  in.seekg(0, std::ios::end);
  const uint64_t file_size = uint64_t(in.tellg());
  in.seekg(0);
  if (file_size < 8) fail(path, "truncated: " + std::to_string(file_size) + " bytes, no header length");

  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  if (header_len > file_size - 8) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the file size " +
                   std::to_string(file_size) + " (truncated or corrupt)");
  }
  if (header_len > kMaxHeaderBytes) fail(path, "header length " + std::to_string(header_len) + " is too large");
  std::string text(header_len, '\0');
  in.read(text.data(), std::streamsize(header_len));
  if (!in) fail(path, "cannot read the header");

  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  SafetensorsFile file;
  file.path_ = path;
  file.data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - file.data_start_;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object()) fail(path, where + " is not a JSON object");
    TensorInfo info;
    info.file = path;
    const auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) fail(path, where + " has no dtype");
    if (!parse_dtype(dt->get<std::string>(), &info.dtype)) {
      fail(path, where + " has unsupported dtype " + dt->get<std::string>() + " (BF16, F16, F32, I32 are read)");
    }
    const auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array()) fail(path, where + " has no shape");
    for (const auto& s : *shape) {
      if (!s.is_number_unsigned()) fail(path, where + " has a bad shape " + shape->dump());
      info.shape.push_back(s.get<int64_t>());
    }
    const auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      fail(path, where + " has no valid data_offsets");
    }
    info.begin = (*offsets)[0].get<uint64_t>();
    info.end = (*offsets)[1].get<uint64_t>();
    if (info.begin > info.end || info.end > data_size) {
      fail(path, where + " data_offsets " + offsets->dump() + " lie outside the " + std::to_string(data_size) +
                     "-byte data section (truncated or corrupt)");
    }
    // Overflow-safe product: a shape with a huge dimension must not wrap around.
    uint64_t need = uint64_t(dtype_size(info.dtype));
    for (int64_t s : info.shape) {
      if (s != 0 && need > UINT64_MAX / uint64_t(s)) fail(path, where + " has an absurd shape " + shape->dump());
      need *= uint64_t(s);
    }
    if (info.end - info.begin != need) {
      fail(path, where + " holds " + std::to_string(info.end - info.begin) + " bytes but shape " +
                     shape_string(info.shape) + " of " + dtype_name(info.dtype) + " needs " + std::to_string(need));
    }
    file.tensors_.emplace(name, std::move(info));
  }

  // Byte ranges must not overlap.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, info] : file.tensors_) ranges.emplace_back(info.begin, info.end);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) fail(path, "tensor data ranges overlap");
  }
  return file;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, "no tensor '" + name + "'");
  return it->second;
}

std::vector<uint8_t> SafetensorsFile::read_bytes(const TensorInfo& info) const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) fail(path_, "cannot open");
  std::vector<uint8_t> bytes(info.end - info.begin);
  in.seekg(std::streamoff(data_start_ + info.begin));
  in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!in || uint64_t(in.gcount()) != bytes.size()) fail(path_, "short read (file changed or truncated)");
  return bytes;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const std::vector<uint8_t> bytes = read_bytes(ti);
  const size_t n = size_t(ti.numel());
  std::vector<float> out(n);
  switch (ti.dtype) {
    case Dtype::f32:
      std::memcpy(out.data(), bytes.data(), n * 4);
      break;
    case Dtype::bf16:
    case Dtype::f16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = ti.dtype == Dtype::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
      }
      break;
    case Dtype::i32:
      fail(path_, "tensor '" + name + "' is I32, not a float tensor");
  }
  return out;
}

std::vector<int32_t> SafetensorsFile::read_i32(const std::string& name) const {
  const TensorInfo& ti = info(name);
  if (ti.dtype != Dtype::i32) fail(path_, "tensor '" + name + "' is " + dtype_name(ti.dtype) + ", not I32");
  const std::vector<uint8_t> bytes = read_bytes(ti);
  std::vector<int32_t> out(size_t(ti.numel()));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

SafetensorsArchive SafetensorsArchive::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";
  SafetensorsArchive archive;

  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;  // from the index: tensor -> shard
  if (fs::is_directory(index_path)) throw Error("checkpoint index " + index_path.string() + " is a directory, not a file");
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      throw Error("checkpoint index " + index_path.string() + " is not valid JSON (" + e.what() + ")");
    }
    const auto wm = index.find("weight_map");
    if (!index.is_object() || wm == index.end() || !wm->is_object()) {
      throw Error("checkpoint index " + index_path.string() + " has no weight_map object");
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : wm->items()) {
      if (!shard.is_string()) throw Error("checkpoint index " + index_path.string() + ": bad entry for " + name);
      // Shard names are plain file names next to the index; refuse paths that escape it.
      const std::string s = shard.get<std::string>();
      if (s.find('/') != std::string::npos || s.find('\\') != std::string::npos || s == ".." || s.empty()) {
        throw Error("checkpoint index " + index_path.string() + ": bad shard name '" + s + "'");
      }
      weight_map[name] = s;
      shards.insert(s);
    }
    shard_names.assign(shards.begin(), shards.end());
  } else if (fs::exists(single_path)) {
    shard_names.push_back("model.safetensors");
  } else {
    throw Error("no model.safetensors or model.safetensors.index.json in " + dir);
  }

  for (const std::string& shard : shard_names) {
    const fs::path p = root / shard;
    if (!fs::exists(p)) throw Error("checkpoint shard " + p.string() + " is missing");
    archive.files_.push_back(SafetensorsFile::open(p.string()));
    const size_t k = archive.files_.size() - 1;
    for (const auto& [name, info] : archive.files_[k].tensors()) {
      if (!archive.where_.emplace(name, k).second) {
        throw Error("tensor '" + name + "' appears in more than one shard (" + shard + " and " +
                    archive.files_[archive.where_[name]].path() + ")");
      }
    }
  }
  for (const auto& [name, shard] : weight_map) {
    const auto it = archive.where_.find(name);
    if (it == archive.where_.end() || fs::path(archive.files_[it->second].path()).filename() != shard) {
      throw Error("checkpoint index says tensor '" + name + "' is in " + shard + " but it is not there");
    }
  }
  return archive;
}

std::vector<std::string> SafetensorsArchive::names() const {
  std::vector<std::string> out;
  for (const auto& [name, k] : where_) out.push_back(name);
  return out;
}

const TensorInfo& SafetensorsArchive::info(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw Error("checkpoint has no tensor '" + name + "'");
  return files_[it->second].info(name);
}

std::vector<float> SafetensorsArchive::read_f32(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw Error("checkpoint has no tensor '" + name + "'");
  return files_[it->second].read_f32(name);
}

}  // namespace fp4kv::model
