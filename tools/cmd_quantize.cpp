// `fp4kv quantize`: see how a tensor quantizes to NVFP4 or MXFP4.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "fp4kv/core/tensor_quant.h"
#include "fp4kv/eval/limits.h"
#include "tools/commands.h"

namespace fp4kv::cli {

namespace {

// The raw bytes, the float copy, the dequantized copy and the codes are alive at once.
constexpr double kQuantizeBytesPerInputByte = 3.5;

std::vector<uint8_t> read_input(const std::string& path) {
  eval::require_regular_file(path, "--in");
  const uint64_t size = std::filesystem::file_size(path);
  eval::require_fits_memory(kQuantizeBytesPerInputByte * double(size), eval::available_memory_bytes(), "--in",
                            "quantizing the " + std::to_string(size) + "-byte '" + path + "'");
  std::ifstream in(path, std::ios::binary);
  require(bool(in), "--in: cannot read '" + path + "'");
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

struct QuantizeArgs {
  std::string format = "nvfp4", in, out;
  bool search = false;
  std::optional<float> global_scale;
};

int run_quantize(const QuantizeArgs& a) {
  const KvFormat format = a.format == "nvfp4" ? KvFormat::nvfp4 : KvFormat::mxfp4;
  check_output_writable(a.out, "--out");
  const std::vector<uint8_t> raw = read_input(a.in);
  require(raw.size() % 4 == 0, "'" + a.in + "' has " + std::to_string(raw.size()) +
                                   " bytes: not a whole number of float32 values (truncated?)");
  std::vector<float> x(raw.size() / 4);
  std::memcpy(x.data(), raw.data(), raw.size());
  const QuantizedTensor t = quantize_tensor(x.data(), x.size(), format, a.search, a.global_scale);
  const std::vector<uint8_t> bytes = t.serialize();
  write_output_file(a.out, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "--out");

  const std::vector<float> y = dequantize_tensor(t);
  double se = 0.0, ref = 0.0;
  long zero_blocks = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = std::isfinite(x[i]) ? x[i] : 0.0;
    se += (y[i] - xi) * (y[i] - xi);
    ref += xi * xi;
  }
  for (uint8_t s : t.scales) zero_blocks += format == KvFormat::nvfp4 ? (s == 0) : 0;
  std::printf("format            %s%s\n", a.format.c_str(), a.search ? " (scale search)" : "");
  std::printf("values            %zu in %zu blocks of %d\n", x.size(), t.scales.size(), t.block());
  if (format == KvFormat::nvfp4) std::printf("global scale g    %.9g\n", double(t.g));
  std::printf("rmse              %.6g\n", std::sqrt(se / double(x.size())));
  std::printf("relative error    %.6g\n", ref > 0 ? std::sqrt(se / ref) : 0.0);
  std::printf("zero-scale blocks %ld\n", zero_blocks);
  if (a.search) std::printf("search switched   %ld blocks\n", t.alternative_scale_blocks);
  std::printf("non-finite input  %ld (encoded as 0)\n", t.nonfinite);
  std::printf("wrote             %zu bytes to %s\n", bytes.size(), a.out.c_str());
  return 0;
}

}  // namespace

Action add_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand("quantize", "Quantize a raw float32 tensor to NVFP4 or MXFP4 and report the error");
  sub->add_option("--format", args->format, "nvfp4 or mxfp4")->check(CLI::IsMember({"nvfp4", "mxfp4"}));
  sub->add_flag("--search", args->search, "block-scale search (kappa 4 vs 6; e_ocp vs e_ocp+1)");
  sub->add_option("--global-scale", args->global_scale, "NVFP4 global scale g (default amax/2688)");
  sub->add_option("--in", args->in, "input: little-endian float32 values")->required();
  sub->add_option("--out", args->out, "output: codes, scales, then (NVFP4) float32 g")->required();
  return [args] { return eval::with_memory_guard("quantizing --in", [&] { return run_quantize(*args); }); };
}

}  // namespace fp4kv::cli
