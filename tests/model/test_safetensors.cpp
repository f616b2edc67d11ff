#include "fp4kv/model/safetensors.h"

#include <gtest/gtest.h>

#include "fixtures.h"
#include "fp4kv/core/error.h"

namespace fp4kv::model {
namespace {

using namespace fp4kv::model::testing;

TEST(Safetensors, ReadsEveryDtype) {
  TempDir dir;
  std::vector<RawTensor> tensors;
  tensors.push_back(f32_tensor("a", {2, 3}, {1, 2, 3, 4, 5, -6.5f}));
  tensors.push_back(bf16_tensor("b", {3}, {1.5f, -2.0f, 0.0078125f}));
  RawTensor h{"c", "F16", {2}, std::vector<uint8_t>(4)};
  const uint16_t h0 = float_to_fp16_bits(0.333251953125f), h1 = float_to_fp16_bits(-65504.0f);
  std::memcpy(h.bytes.data(), &h0, 2);
  std::memcpy(h.bytes.data() + 2, &h1, 2);
  tensors.push_back(h);
  RawTensor ids{"ids", "I32", {3}, std::vector<uint8_t>(12)};
  const int32_t iv[3] = {256, 7, -1};
  std::memcpy(ids.bytes.data(), iv, 12);
  tensors.push_back(ids);
  write_safetensors(dir / "x.safetensors", tensors);

  const SafetensorsFile f = SafetensorsFile::open(dir / "x.safetensors");
  EXPECT_EQ(f.tensors().size(), 4u);  // __metadata__ is not a tensor
  EXPECT_EQ(f.info("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.read_f32("a"), (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
  EXPECT_EQ(f.read_f32("b"), (std::vector<float>{1.5f, -2.0f, 0.0078125f}));
  EXPECT_EQ(f.read_f32("c"), (std::vector<float>{0.333251953125f, -65504.0f}));
  EXPECT_EQ(f.read_i32("ids"), (std::vector<int32_t>{256, 7, -1}));
  expect_error([&] { f.read_f32("ids"); }, {"ids", "I32"});
  expect_error([&] { f.read_i32("a"); }, {"'a'", "F32"});
  expect_error([&] { f.info("nope"); }, {"nope", "x.safetensors"});
}

TEST(Safetensors, TruncatedFileIsAnError) {
  TempDir dir;
  const std::string bytes = safetensors_bytes({f32_tensor("w", {4, 4}, std::vector<float>(16, 1.0f))});
  write_text(dir / "t.safetensors", bytes.substr(0, bytes.size() - 10));
  expect_error([&] { SafetensorsFile::open(dir / "t.safetensors"); }, {"t.safetensors", "'w'", "truncated"});
  write_text(dir / "t.safetensors", bytes.substr(0, 5));
  expect_error([&] { SafetensorsFile::open(dir / "t.safetensors"); }, {"t.safetensors", "truncated"});
}

TEST(Safetensors, HeaderLengthBeyondFileIsAnError) {
  TempDir dir;
  std::string bytes = safetensors_bytes({f32_tensor("w", {2}, {1, 2})});
  const uint64_t huge = bytes.size() + 100;
  std::memcpy(bytes.data(), &huge, 8);
  write_text(dir / "h.safetensors", bytes);
  expect_error([&] { SafetensorsFile::open(dir / "h.safetensors"); },
               {"h.safetensors", "header length", "exceeds the file size"});
}

TEST(Safetensors, CorruptHeadersAreErrors) {
  TempDir dir;
  auto with_header = [&](const std::string& header) {
    std::string out(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    write_text(dir / "c.safetensors", out + header + std::string(16, '\0'));
  };
  const std::string path = dir / "c.safetensors";
  with_header("{not json");
  expect_error([&] { SafetensorsFile::open(path); }, {"c.safetensors", "not valid JSON"});
  with_header(R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})");
  expect_error([&] { SafetensorsFile::open(path); }, {"'w'", "unsupported dtype F64"});
  with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})");
  expect_error([&] { SafetensorsFile::open(path); }, {"'w'", "16 bytes", "[3]", "needs 12"});
  with_header(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})");
  expect_error([&] { SafetensorsFile::open(path); }, {"'w'", "bad shape"});
  with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,24]}})");
  expect_error([&] { SafetensorsFile::open(path); }, {"'w'", "outside"});
  with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})");
  expect_error([&] { SafetensorsFile::open(path); }, {"overlap"});
  with_header(R"({"w":{"dtype":"F32","shape":[2]}})");
  expect_error([&] { SafetensorsFile::open(path); }, {"'w'", "data_offsets"});
  with_header(R"([1,2])");
  expect_error([&] { SafetensorsFile::open(path); }, {"not a JSON object"});
  expect_error([&] { SafetensorsFile::open(dir / "absent.safetensors"); }, {"absent.safetensors", "cannot open"});
}

TEST(Safetensors, ShardedArchive) {
  TempDir dir;
  write_safetensors(dir / "model-00001-of-00002.safetensors", {f32_tensor("a", {2}, {1, 2})});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {f32_tensor("b", {1}, {3})});
  write_text(dir / "model.safetensors.index.json",
             R"({"metadata":{},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  const SafetensorsArchive archive = SafetensorsArchive::open_dir(dir.str());
  EXPECT_EQ(archive.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(archive.read_f32("b"), std::vector<float>{3});

  // The index names a tensor its shard does not hold.
  write_text(dir / "model.safetensors.index.json",
             R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors"}})");
  expect_error([&] { SafetensorsArchive::open_dir(dir.str()); }, {"'b'", "model-00001-of-00002.safetensors"});
  // A shard the index names is missing.
  write_text(dir / "model.safetensors.index.json", R"({"weight_map":{"a":"model-00009-of-00009.safetensors"}})");
  expect_error([&] { SafetensorsArchive::open_dir(dir.str()); }, {"model-00009-of-00009.safetensors", "missing"});
  // No weights at all.
  TempDir empty;
  expect_error([&] { SafetensorsArchive::open_dir(empty.str()); }, {"no model.safetensors"});
}

TEST(Safetensors, ReadsThePk8lCheckpoint) {
  const SafetensorsArchive archive = SafetensorsArchive::open_dir(pk8l_dir());
  EXPECT_EQ(archive.names().size(), 90u);  // 8 layers x 11 + embed + final norm (tied head)
  const TensorInfo& e = archive.info("model.embed_tokens.weight");
  EXPECT_EQ(e.dtype, Dtype::bf16);
  EXPECT_EQ(e.shape, (std::vector<int64_t>{264, 512}));
}

}  // namespace
}  // namespace fp4kv::model
