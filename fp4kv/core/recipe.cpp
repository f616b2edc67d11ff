#include "fp4kv/core/recipe.h"

#include <map>
#include <set>
#include <sstream>

#include "fp4kv/core/error.h"

namespace fp4kv {

int Recipe::block() const {
  switch (kv) {
    case KvFormat::nvfp4: return 16;
    case KvFormat::mxfp4: return 32;
    default: return 0;
  }
}

std::string to_string(KvFormat f) {
  switch (f) {
    case KvFormat::fp32: return "fp32";
    case KvFormat::bf16: return "bf16";
    case KvFormat::fp8: return "fp8";
    case KvFormat::nvfp4: return "nvfp4";
    case KvFormat::mxfp4: return "mxfp4";
  }
  return "?";
}

namespace {

Recipe make(KvFormat kv, QueryFormat q, ProbFormat p, bool full_recipe) {
  Recipe r;
  r.kv = kv;
  r.query = q;
  r.prob = p;
  r.smooth_keys = r.rotate_keys = r.key_search = r.bf16_sink = full_recipe;
  return r;
}

const std::map<std::string, Recipe>& presets() {
  using K = KvFormat;
  using Q = QueryFormat;
  using P = ProbFormat;
  static const std::map<std::string, Recipe> table = {
      {"fp32", make(K::fp32, Q::full, P::full, false)},
      {"bf16", make(K::bf16, Q::full, P::full, false)},
      {"fp8", make(K::fp8, Q::full, P::full, false)},
      {"nvfp4-vanilla", make(K::nvfp4, Q::full, P::full, false)},
      {"nvfp4-vanilla-native", make(K::nvfp4, Q::fp4, P::fp4_max6, false)},
      {"nvfp4", make(K::nvfp4, Q::full, P::full, true)},
      {"nvfp4-native", make(K::nvfp4, Q::dual_fp4, P::fp4_underflow, true)},
      {"mxfp4-vanilla", make(K::mxfp4, Q::full, P::full, false)},
      {"mxfp4-vanilla-native", make(K::mxfp4, Q::fp4, P::fp4_max6, false)},
      {"mxfp4", make(K::mxfp4, Q::full, P::full, true)},
      {"mxfp4-native", make(K::mxfp4, Q::dual_fp4, P::fp4_underflow, true)},
  };
  return table;
}

std::string known_presets() {
  std::string s;
  for (const auto& name : preset_names()) s += (s.empty() ? "" : ", ") + name;
  return s;
}

void apply_switch(Recipe& r, const std::string& sw, const std::string& preset) {
  auto needs = [&](bool applies, const char* what) {
    require(applies, "switch '" + sw + "' does not apply to preset '" + preset + "' (it has no " + what + ")");
  };
  if (sw == "no-dualq") {
    needs(r.query == QueryFormat::dual_fp4, "dual-residual query");
    r.query = QueryFormat::fp4;
  } else if (sw == "no-pscale") {
    needs(r.prob == ProbFormat::fp4_underflow, "underflow-aware P scaling");
    r.prob = ProbFormat::fp4_max6;
  } else if (sw == "no-smooth") {
    needs(r.smooth_keys, "key smoothing");
    r.smooth_keys = false;
  } else if (sw == "no-rotate") {
    needs(r.rotate_keys, "Hadamard rotation");
    r.rotate_keys = false;
  } else if (sw == "no-search") {
    needs(r.key_search, "key scale search");
    r.key_search = false;
  } else if (sw == "no-sink") {
    needs(r.bf16_sink, "BF16 sink");
    r.bf16_sink = false;
  } else if (sw == "no-recent") {
    needs(r.bf16_recent && (r.fp4() || r.kv == KvFormat::fp8), "BF16 recent tokens");
    r.bf16_recent = false;
  } else if (sw == "smoothq") {
    needs(r.native() && r.fp4(), "FP4 query");
    r.query = QueryFormat::smooth_fp4;
  } else if (sw == "twolevel") {
    needs(r.native() && r.kv == KvFormat::nvfp4, "NVFP4 probabilities");
    r.prob = ProbFormat::fp4_two_level;
  } else if (sw == "fp8qp") {
    needs(r.query == QueryFormat::full && (r.fp4() || r.kv == KvFormat::fp8), "16-bit Q and P on quantized pages");
    r.query = QueryFormat::fp8;
    r.prob = ProbFormat::fp8;
  } else {
    throw Error("unknown switch '" + sw +
                "' (known: no-dualq, no-pscale, no-smooth, no-rotate, no-search, no-sink, no-recent, smoothq, twolevel, "
                "fp8qp)");
  }
}

bool is_switch_token(const std::string& t) {
  return t.rfind("no-", 0) == 0 || t == "smoothq" || t == "twolevel" || t == "fp8qp";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {
      "fp32", "bf16", "fp8", "nvfp4-vanilla", "nvfp4-vanilla-native", "nvfp4", "nvfp4-native",
      "mxfp4-vanilla", "mxfp4-vanilla-native", "mxfp4", "mxfp4-native"};
  return names;
}

Recipe parse_recipe(const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string preset = spec.substr(0, colon);
  const auto it = presets().find(preset);
  require(it != presets().end(),
          "unknown preset '" + preset + "' (known: " + known_presets() + ")");
  Recipe r = it->second;
  r.name = preset;
  if (colon == std::string::npos) return r;
  std::string canon;
  std::set<std::string> seen;
  for (std::string sw : split(spec.substr(colon + 1), ',')) {
    for (const std::string& part : split(sw, '+')) {
      require(!part.empty(), "empty switch in '" + spec + "'");
      // Checked before applying: a repeated switch would otherwise read as "does not apply".
      require(seen.insert(part).second, "switch '" + part + "' is given twice in '" + spec + "'");
      apply_switch(r, part, preset);
      canon += (canon.empty() ? "" : ",") + part;
    }
  }
  require(!canon.empty(), "no switch after ':' in '" + spec + "'");
  r.name = preset + ":" + canon;
  return r;
}

std::vector<Recipe> parse_recipe_list(const std::string& list) {
  // Commas separate recipes, but also the switches of one recipe: a token that is a switch
  // belongs to the recipe before it ("nvfp4-native:no-dualq,no-pscale,bf16" is two).
  std::vector<std::string> specs;
  for (const std::string& tok : split(list, ',')) {
    require(!tok.empty(), "empty entry in recipe list '" + list + "'");
    if (is_switch_token(tok)) {
      require(!specs.empty() && specs.back().find(':') != std::string::npos,
              "switch '" + tok + "' must follow 'PRESET:' in '" + list + "'");
      specs.back() += "," + tok;
    } else {
      specs.push_back(tok);
    }
  }
  std::vector<Recipe> out;
  for (const auto& s : specs) out.push_back(parse_recipe(s));
  return out;
}

}  // namespace fp4kv
