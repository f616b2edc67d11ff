#include <gtest/gtest.h>

#include "fp4kv/core/error.h"
#include "fp4kv/core/recipe.h"

namespace fp4kv {
namespace {

TEST(Recipe, PresetTable) {
  const Recipe a = parse_recipe("nvfp4-native");
  EXPECT_EQ(a.kv, KvFormat::nvfp4);
  EXPECT_EQ(a.query, QueryFormat::dual_fp4);
  EXPECT_EQ(a.prob, ProbFormat::fp4_underflow);
  EXPECT_TRUE(a.smooth_keys && a.rotate_keys && a.key_search && a.bf16_sink && a.bf16_recent);
  EXPECT_TRUE(a.native());

  const Recipe b = parse_recipe("nvfp4");
  EXPECT_FALSE(b.native());
  EXPECT_TRUE(b.smooth_keys && b.rotate_keys && b.key_search && b.bf16_sink && b.bf16_recent);

  const Recipe c = parse_recipe("nvfp4-vanilla-native");
  EXPECT_EQ(c.query, QueryFormat::fp4);
  EXPECT_EQ(c.prob, ProbFormat::fp4_max6);
  EXPECT_FALSE(c.smooth_keys || c.rotate_keys || c.key_search || c.bf16_sink);
  EXPECT_TRUE(c.bf16_recent);  // every preset keeps the unfinished page in BF16

  const Recipe v = parse_recipe("nvfp4-vanilla");
  EXPECT_FALSE(v.native() || v.key_transform() || v.key_search || v.bf16_sink);

  EXPECT_EQ(parse_recipe("mxfp4-native").kv, KvFormat::mxfp4);
  EXPECT_EQ(parse_recipe("mxfp4-native").block(), 32);
  EXPECT_EQ(parse_recipe("fp8").kv, KvFormat::fp8);
  EXPECT_FALSE(parse_recipe("fp8").bf16_sink);
  EXPECT_TRUE(parse_recipe("fp8").bf16_recent);
  EXPECT_EQ(parse_recipe("bf16").kv, KvFormat::bf16);
  for (const auto& name : preset_names()) EXPECT_EQ(parse_recipe(name).name, name);
}

TEST(Recipe, AblationSwitches) {
  const Recipe r = parse_recipe("nvfp4-native:no-dualq,no-pscale");
  EXPECT_EQ(r.query, QueryFormat::fp4);
  EXPECT_EQ(r.prob, ProbFormat::fp4_max6);
  EXPECT_EQ(r.name, "nvfp4-native:no-dualq,no-pscale");
  const Recipe s = parse_recipe("nvfp4-native:no-smooth+no-rotate+no-search+no-sink+no-recent");
  EXPECT_FALSE(s.smooth_keys || s.rotate_keys || s.key_search || s.bf16_sink || s.bf16_recent);
  EXPECT_FALSE(parse_recipe("fp8:no-recent").bf16_recent);
  EXPECT_EQ(parse_recipe("nvfp4-native:smoothq").query, QueryFormat::smooth_fp4);
  EXPECT_EQ(parse_recipe("nvfp4-native:twolevel").prob, ProbFormat::fp4_two_level);
  for (const char* mixed : {"nvfp4:fp8qp", "mxfp4-vanilla:fp8qp", "fp8:fp8qp"}) {
    const Recipe q = parse_recipe(mixed);
    EXPECT_EQ(q.query, QueryFormat::fp8) << mixed;
    EXPECT_EQ(q.prob, ProbFormat::fp8) << mixed;
    EXPECT_FALSE(q.native()) << mixed << ": FP8 operands are a mixed mode";
  }
}

TEST(Recipe, ListSplitsOnPresetNames) {
  const auto list = parse_recipe_list("bf16,nvfp4-native:no-dualq,no-pscale,mxfp4");
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[1].name, "nvfp4-native:no-dualq,no-pscale");
  EXPECT_EQ(list[2].name, "mxfp4");
}

TEST(Recipe, BadNamesAreClearErrors) {
  auto message = [](const std::string& spec) {
    try {
      parse_recipe_list(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("nvfp5").find("unknown preset 'nvfp5'"), std::string::npos);
  EXPECT_NE(message("nvfp4-native:no-magic").find("unknown switch 'no-magic'"), std::string::npos);
  EXPECT_NE(message("nvfp4:no-dualq").find("does not apply"), std::string::npos);
  EXPECT_NE(message("bf16:no-sink").find("does not apply"), std::string::npos);
  EXPECT_NE(message("bf16:no-recent").find("does not apply"), std::string::npos);
  EXPECT_NE(message("fp8:no-sink").find("does not apply"), std::string::npos);
  EXPECT_NE(message("mxfp4-native:twolevel").find("does not apply"), std::string::npos);
  EXPECT_NE(message("nvfp4-native:fp8qp").find("does not apply"), std::string::npos);
  EXPECT_NE(message("bf16:fp8qp").find("does not apply"), std::string::npos);
  EXPECT_NE(message("no-sink").find("must follow"), std::string::npos);
  EXPECT_NE(message("nvfp4-native:").find("no switch"), std::string::npos);
  EXPECT_NE(message("bf16,,fp8").find("empty entry"), std::string::npos);
}

TEST(Recipe, RepeatedSwitchHasItsOwnMessage) {
  for (const std::string spec : {"nvfp4:no-sink,no-sink", "nvfp4-native:no-dualq+no-pscale+no-dualq",
                                 "nvfp4:no-rotate,no-search,no-rotate"}) {
    try {
      parse_recipe_list(spec);
      ADD_FAILURE() << "no error for " << spec;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("given twice"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("does not apply"), std::string::npos) << msg;
    }
  }
  // Distinct switches are still fine.
  EXPECT_EQ(parse_recipe("nvfp4:no-sink,no-recent").name, "nvfp4:no-sink,no-recent");
}

}  // namespace
}  // namespace fp4kv
