// `fp4kv quantize` end to end through the binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <cstring>
#include <unistd.h>

#include "cli.h"
#include "fp4kv/core/tensor_quant.h"

namespace fp4kv {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("fp4kv_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void write_floats(const fs::path& p, const std::vector<float>& x) {
  std::ofstream o(p, std::ios::binary);
  o.write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TEST(CliQuantize, RoundTripMatchesTheLibrary) {
  const fs::path dir = temp_dir();
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(512);
  for (auto& v : x) v = nd(rng);
  x[17] = 40.0f;
  write_floats(dir / "x.f32", x);
  for (const char* fmt : {"nvfp4", "mxfp4"}) {
    for (bool search : {false, true}) {
      const auto r = test::run_cli(std::string("quantize --format ") + fmt + (search ? " --search" : "") + " --in " +
                                   (dir / "x.f32").string() + " --out " + (dir / "y.bin").string());
      ASSERT_EQ(r.code, 0) << r.output;
      EXPECT_NE(r.output.find("relative error"), std::string::npos);
      const KvFormat f = std::string(fmt) == "nvfp4" ? KvFormat::nvfp4 : KvFormat::mxfp4;
      const auto bytes = read_bytes(dir / "y.bin");
      const QuantizedTensor want = quantize_tensor(x.data(), x.size(), f, search);
      EXPECT_EQ(bytes, want.serialize()) << fmt;
      // Dequantizing the file gets close to the input.
      const auto y = dequantize_tensor(QuantizedTensor::parse(bytes, f, x.size()));
      double err = 0, ref = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        err += (y[i] - x[i]) * (y[i] - x[i]);
        ref += x[i] * x[i];
      }
      EXPECT_LT(std::sqrt(err / ref), 0.3) << fmt;
    }
  }
  // An explicit global scale is written at the end of the file.
  const auto r = test::run_cli("quantize --format nvfp4 --global-scale 0.5 --in " + (dir / "x.f32").string() +
                               " --out " + (dir / "y.bin").string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto bytes = read_bytes(dir / "y.bin");
  float g;
  std::memcpy(&g, &bytes[bytes.size() - 4], 4);
  EXPECT_EQ(g, 0.5f);
  fs::remove_all(dir);
}

TEST(CliQuantize, BadInputGivesAClearErrorAndNonZeroExit) {
  const fs::path dir = temp_dir();
  write_floats(dir / "odd.f32", std::vector<float>(20, 1.0f));
  {
    std::ofstream o(dir / "trunc.f32", std::ios::binary);
    o << "abcdefg";  // 7 bytes
  }
  struct Case {
    std::string args, message;
  } cases[] = {
      {"quantize --in " + (dir / "missing.f32").string() + " --out " + (dir / "o").string(), "cannot read"},
      {"quantize --in " + (dir / "trunc.f32").string() + " --out " + (dir / "o").string(), "truncated"},
      {"quantize --in " + (dir / "odd.f32").string() + " --out " + (dir / "o").string(), "not a multiple"},
      {"quantize --format nvfp5 --in " + (dir / "odd.f32").string() + " --out " + (dir / "o").string(), "nvfp5"},
      {"quantize --global-scale -1 --in " + (dir / "odd.f32").string() + " --out " + (dir / "o").string(), "multiple"},
  };
  for (const auto& c : cases) {
    const auto r = test::run_cli(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
  write_floats(dir / "ok.f32", std::vector<float>(16, 1.0f));
  const auto r = test::run_cli("quantize --global-scale -1 --in " + (dir / "ok.f32").string() + " --out " +
                               (dir / "o").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("global-scale"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fp4kv
