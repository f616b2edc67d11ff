// Calibration::load checks every value of a calibration file against the model: shape,
// finiteness and length of mu_k, and tau within the codes that mean something. Each
// test starts from the real pk8l calibration and breaks one thing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fp4kv/core/error.h"
#include "fp4kv/eval/calibration.h"
#include "fp4kv/model/qwen3.h"

namespace fp4kv::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kModel = std::string(FP4KV_SOURCE_DIR) + "/models/pk8l";

const model::Qwen3Model& pk8l() {
  static const model::Qwen3Model m = model::Qwen3Model::load(kModel);
  return m;
}

json pk8l_calibration() {
  std::ifstream in(kModel + "/" + kCalibrationFile);
  return json::parse(in);
}

class CalibrationFile : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("fp4kv_calib_file_" + std::to_string(::getpid()));
  json j = pk8l_calibration();
  void SetUp() override { fs::create_directories(dir); }
  void TearDown() override { fs::remove_all(dir); }

  std::string write(const std::string& text) {
    const std::string path = (dir / "c.json").string();
    std::ofstream(path) << text;
    return path;
  }
  // The Error message of loading `text` with the model's key norm bounds, or "no error".
  std::string load_error(const std::string& text) {
    try {
      Calibration::load(write(text), pk8l().config(), pk8l().key_norm_bounds());
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }
  void expect_rejected(const std::string& part) {
    const std::string msg = load_error(j.dump());
    EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
};

TEST_F(CalibrationFile, TheSavedPk8lCalibrationLoads) {
  const Calibration c = Calibration::load(kModel + "/" + kCalibrationFile, pk8l().config(), pk8l().key_norm_bounds());
  EXPECT_EQ(c.mu_k.size(), size_t(8 * 2 * 128));  // pk8l: 8 layers, 2 KV heads, head_dim 128
}

TEST_F(CalibrationFile, NonFiniteMuIsRejected) {
  // JSON has no NaN or Inf; a number beyond float's range is what reaches the reader.
  j["mu_k"][5] = 1e39;
  expect_rejected("mu_k[5]");
  expect_rejected("not a finite float");
  j["mu_k"][5] = nullptr;  // what a writer that printed NaN as null leaves
  expect_rejected("not a number");
}

TEST_F(CalibrationFile, AbsurdMuIsRejected) {
  // pk8l's k_norm weights are O(1) and head_dim is 128: no key is longer than ~100.
  j["mu_k"][128 * 3 + 7] = 1e6;  // layer 1, KV head 1
  expect_rejected("layer 1, KV head 1");
  expect_rejected("longer than any key");
}

TEST_F(CalibrationFile, WrongLengthOrShapeIsRejected) {
  json short_mu = j;
  short_mu["mu_k"].erase(short_mu["mu_k"].size() - 1);
  EXPECT_NE(load_error(short_mu.dump()).find("2047 mu_k values"), std::string::npos);
  json layers = j;
  layers["layers"] = 7;
  EXPECT_NE(load_error(layers.dump()).find("another model shape"), std::string::npos);
  json heads = j;
  heads["kv_heads"] = 4;
  EXPECT_NE(load_error(heads.dump()).find("another model shape"), std::string::npos);
  json mu_not_list = j;
  mu_not_list["mu_k"] = 0.5;
  EXPECT_NE(load_error(mu_not_list.dump()).find("not a list"), std::string::npos);
}

TEST_F(CalibrationFile, MeaningfulTauCodes) {
  // c * max(p_b) <= c: for c = 8 = 2^3 the E4M3 code of 8 is exponent field 10, mantissa 0
  // = 80, and tau(80) = (8 + 9) / 2 is the first candidate >= 8. For c = 1: code 7 << 3 = 56.
  EXPECT_EQ(max_meaningful_tau_code(8.0f), 80);
  EXPECT_EQ(max_meaningful_tau_code(1.0f), 56);
  EXPECT_FLOAT_EQ(tau_of_code(10), 21.0f / 1024);  // the paper's default sits on the grid
}

TEST_F(CalibrationFile, TauOutsideItsRangeIsRejected) {
  j["tau_code"] = 81;
  j["tau"] = 9.5;  // the midpoint of 9 and 10, beyond c = 8
  expect_rejected("tau_code 81 is outside 0..80");
  j["tau_code"] = -1;
  j["tau"] = 0.0;
  expect_rejected("tau_code -1 is outside");
}

TEST_F(CalibrationFile, TauThatIsNotItsCodesMidpointIsRejected) {
  j["tau"] = 0.5;  // code 3's midpoint is 7/1024
  expect_rejected("not the midpoint");
  j["tau"] = 1e300;
  expect_rejected("not the midpoint");
  j["tau"] = 7.0 / 1024;
  EXPECT_EQ(load_error(j.dump()), "no error");
}

TEST_F(CalibrationFile, DirectoryHugeFileAndOtherJsonAreRejected) {
  std::string msg;
  try {
    Calibration::load(dir.string(), pk8l().config());
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("is a directory"), std::string::npos) << msg;
  EXPECT_NE(load_error(j.dump() + std::string(4 << 20, ' ')).find("far more than"), std::string::npos);
  EXPECT_NE(load_error(R"({"format": "something-else"})").find("not an fp4kv calibration file"), std::string::npos);
}

}  // namespace
}  // namespace fp4kv::eval
