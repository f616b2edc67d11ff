// DecodeAttention's construction checks, on the CPU: every unsupported combination of
// format, head_dim, group size, recipe and capacity throws fp4kv::Error naming the bad
// value before the constructor makes any CUDA call, so these tests need no device (and
// would fail with a CUDA error instead of the expected message if a check came too late).
// Supported combinations are checked with the static check_supported (the constructor
// itself would go on to allocate on the device).
#include <gtest/gtest.h>

#include <string>

#include "fp4kv/attention/decode.h"
#include "fp4kv/attention/mla_decode.h"
#include "fp4kv/core/error.h"

namespace fp4kv::test {
namespace {

using attention::DecodeAttention;
using attention::DecodeCapacity;
using attention::DecodeGeometry;

const DecodeGeometry kGeometry{8, 2, 128};  // G = 4
const DecodeCapacity kCapacity{4, 16, 8};

// The message of the Error the constructor throws ("" if it throws none or another type).
std::string construct_error(const DecodeGeometry& g, const std::string& recipe, const DecodeCapacity& c = kCapacity) {
  try {
    DecodeAttention attn(g, parse_recipe(recipe), c);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an fp4kv::Error: ") + e.what();
  }
  return "";
}

void expect_rejected(const DecodeGeometry& g, const std::string& recipe, const std::string& names,
                     const DecodeCapacity& c = kCapacity) {
  const std::string msg = construct_error(g, recipe, c);
  EXPECT_NE(msg.find(names), std::string::npos) << recipe << ": expected an error naming '" << names << "', got '"
                                                 << msg << "'";
  EXPECT_THROW(DecodeAttention::check_supported(g, parse_recipe(recipe), c), Error) << recipe;
}

TEST(DecodeAttentionApi, SupportedCombinationsPassTheChecks) {
  for (const char* r : {"nvfp4", "nvfp4-native", "mxfp4", "mxfp4-native", "fp8", "bf16", "nvfp4-vanilla-native",
                        "nvfp4-native:no-sink,no-recent"})
    for (int d : {64, 128, 256})
      for (int G : {1, 2, 4, 8, 16})
        EXPECT_NO_THROW(DecodeAttention::check_supported(DecodeGeometry{2 * G, 2, d}, parse_recipe(r), kCapacity))
            << r << " d=" << d << " G=" << G;
}

TEST(DecodeAttentionApi, UnsupportedRecipesThrowBeforeAnyDeviceCall) {
  expect_rejected(kGeometry, "nvfp4-native:smoothq", "CPU-reference-only");
  expect_rejected(kGeometry, "nvfp4-native:twolevel", "CPU-reference-only");
  expect_rejected(kGeometry, "nvfp4:fp8qp", "CPU-reference-only");
  expect_rejected(kGeometry, "fp32", "fp32");
}

TEST(DecodeAttentionApi, UnsupportedGeometryThrowsNamingTheValue) {
  expect_rejected(DecodeGeometry{8, 2, 96}, "nvfp4", "head_dim 96");
  expect_rejected(DecodeGeometry{6, 2, 128}, "nvfp4", "group size 3");     // G = 3
  expect_rejected(DecodeGeometry{64, 2, 128}, "nvfp4", "group size 32");   // G = 32
  expect_rejected(DecodeGeometry{7, 2, 128}, "nvfp4", "q_heads 7");        // not a multiple
  expect_rejected(DecodeGeometry{8, 0, 128}, "nvfp4", "kv_heads 0");
}

TEST(DecodeAttentionApi, BadCapacityThrowsNamingTheValue) {
  expect_rejected(kGeometry, "nvfp4", "max_batch 0", DecodeCapacity{0, 16, 8});
  expect_rejected(kGeometry, "nvfp4", "max_batch 70000", DecodeCapacity{70000, 16, 8});
  expect_rejected(kGeometry, "nvfp4", "max_pages 0", DecodeCapacity{4, 0, 8});
  expect_rejected(kGeometry, "nvfp4", "max_splits 0", DecodeCapacity{4, 16, 0});
  expect_rejected(kGeometry, "nvfp4", "max_splits 5000", DecodeCapacity{4, 16, 5000});
}

TEST(DecodeAttentionApi, ErrorsNameTheRecipe) {
  const std::string msg = construct_error(DecodeGeometry{8, 2, 96}, "mxfp4-native");
  EXPECT_NE(msg.find("mxfp4-native"), std::string::npos) << msg;
}

// MlaDecodeAttention's checks, on the CPU: each unsupported value named.
TEST(MlaDecodeApi, UnsupportedShapesAndFormatsAreRefusedByName) {
  using attention::MlaCapacity;
  using attention::MlaDecodeAttention;
  using attention::MlaGeometry;
  const MlaCapacity cap{4, 8, 4};
  auto error_of = [](const MlaGeometry& g, const std::string& recipe, const MlaCapacity& c) -> std::string {
    try {
      MlaDecodeAttention::check_supported(g, parse_recipe(recipe), c);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  for (const char* ok : {"bf16", "nvfp4", "mxfp4", "nvfp4-vanilla", "mxfp4-vanilla", "nvfp4:no-rotate"}) {
    EXPECT_EQ(error_of(MlaGeometry{16}, ok, cap), "") << ok;
    EXPECT_EQ(error_of(MlaGeometry{128}, ok, cap), "") << ok;
  }
  EXPECT_NE(error_of(MlaGeometry{16}, "fp8", cap).find("fp8"), std::string::npos);
  EXPECT_NE(error_of(MlaGeometry{16}, "nvfp4-native", cap).find("mixed mode"), std::string::npos);
  EXPECT_NE(error_of(MlaGeometry{16}, "mxfp4-native", cap).find("mixed mode"), std::string::npos);
  EXPECT_NE(error_of(MlaGeometry{24}, "bf16", cap).find("heads 24"), std::string::npos);
  EXPECT_NE(error_of(MlaGeometry{16, 256}, "nvfp4", cap).find("latent_dim 256"), std::string::npos);
  EXPECT_NE(error_of(MlaGeometry{16}, "bf16", MlaCapacity{0, 8, 4}).find("max_batch 0"), std::string::npos);
  EXPECT_NE(error_of(MlaGeometry{16}, "bf16", MlaCapacity{4, 0, 4}).find("max_pages 0"), std::string::npos);
  EXPECT_NE(error_of(MlaGeometry{16}, "bf16", MlaCapacity{4, 8, 0}).find("max_splits 0"), std::string::npos);
}

}  // namespace
}  // namespace fp4kv::test
