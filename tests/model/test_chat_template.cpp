// Chat templates (fp4kv/model/chat_template.h, jinja.h) against Jinja2 itself: every case of
// tests/model/data/chat_template_cases.json (make_chat_template_fixture.py: templates in the
// form of Qwen3's, Qwen2.5's, Llama 3's and Mistral's, a template of the language's features,
// whitespace corner cases, failing templates) over several conversations renders to Jinja2's
// exact text or fails where Jinja2 fails; then loading from a checkpoint directory and the
// engine's own limits.
#include <gtest/gtest.h>

#include "fp4kv/model/chat_template.h"
#include "tests/model/fixtures.h"

namespace fp4kv::model {
namespace {

using nlohmann::ordered_json;
using testing::expect_error;
using testing::TempDir;
using testing::write_text;

ordered_json read_cases() {
  std::ifstream in(testing::bpe_fixture_path("chat_template_cases.json"));
  return ordered_json::parse(in);
}

jinja::Dict specials_of(const ordered_json& specials) {
  jinja::Dict out;
  for (const auto& [k, v] : specials.items()) out.emplace_back(k, jinja::Value::string(v.get<std::string>()));
  return out;
}

ChatInput input_of(const ordered_json& c) {
  ChatInput in;
  in.messages_json = c["messages"].dump();
  in.tools_json = c["tools"].is_null() ? "" : c["tools"].dump();
  in.variables_json = c["variables"].empty() ? "" : c["variables"].dump();
  in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  return in;
}

// One fixture case: Jinja2's text, its raise_exception message, or a failure of any other kind.
void check_case(const std::string& source, const ordered_json& c, int& rendered, int& raised, int& failed) {
  const jinja::Dict specials = specials_of(c["specials"]);
  if (c.contains("expected")) {
    ++rendered;
    try {
      EXPECT_EQ(ChatTemplate(source, "fixture", specials).render(input_of(c)), c["expected"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << "failed: " << e.what();
    }
    return;
  }
  if (c.contains("raised")) {
    ++raised;
    try {
      ChatTemplate(source, "fixture", specials).render(input_of(c));
      ADD_FAILURE() << "rendered; Jinja2 raised: " << c["raised"];
    } catch (const jinja::RaisedError& e) {
      EXPECT_EQ(std::string(e.what()), c["raised"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << "failed otherwise: " << e.what();
    }
    return;
  }
  ++failed;
  try {
    ChatTemplate(source, "fixture", specials).render(input_of(c));
    ADD_FAILURE() << "rendered; Jinja2 failed with " << c["error"];
  } catch (const jinja::RaisedError& e) {
    ADD_FAILURE() << "a raise_exception error where Jinja2 failed otherwise: " << e.what();
  } catch (const Error&) {
  }
}

TEST(ChatTemplate, EveryFixtureCaseMatchesJinja2) {
  const ordered_json fixture = read_cases();
  int rendered = 0, raised = 0, failed = 0;
  for (const ordered_json& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string source = fixture["templates"][c["template"].get<std::string>()].get<std::string>();
    check_case(source, c, rendered, raised, failed);
  }
  EXPECT_GE(rendered, 100);
  EXPECT_GE(raised, 5);
  EXPECT_GE(failed, 8);
}

TEST(ChatTemplate, PythonNumbersAndStringsPrintAsPythonDoes) {
  using jinja::python_float;
  EXPECT_EQ(python_float(1.0), "1.0");
  EXPECT_EQ(python_float(1e16), "1e+16");
  EXPECT_EQ(python_float(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float(0.0001), "0.0001");
  EXPECT_EQ(python_float(0.00001), "1e-05");
  EXPECT_EQ(python_float(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(python_float(123456789012345678.0), "1.2345678901234568e+17");
  EXPECT_EQ(python_float(-0.0), "-0.0");
  EXPECT_EQ(jinja::python_repr(jinja::Value::string("it's")), "\"it's\"");
  EXPECT_EQ(jinja::python_repr(jinja::Value::string("a'b\"c\n")), "'a\\'b\"c\\n'");
}

ChatTemplate from_source(const std::string& source) { return ChatTemplate(source, "test", {}); }

TEST(ChatTemplate, TheTemplateIsFoundWhereTransformersLooks) {
  TempDir dir;
  EXPECT_FALSE(ChatTemplate::for_model(dir.str()).has_value());  // no tokenizer_config.json
  write_text(dir / "tokenizer_config.json", R"({"eos_token": "<|im_end|>", "bos_token": null})");
  EXPECT_FALSE(ChatTemplate::for_model(dir.str()).has_value());  // no chat_template in it

  write_text(dir / "tokenizer_config.json",
             R"({"eos_token": {"content": "<|im_end|>", "special": true}, "bos_token": null,
                 "chat_template": "{{ eos_token }}|{{ bos_token is defined }}|{{ messages[0].content }}"})");
  ChatInput in;
  in.messages_json = R"([{"role": "user", "content": "hi"}])";
  auto t = ChatTemplate::for_model(dir.str());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->render(in), "<|im_end|>|False|hi");

  write_text(dir / "tokenizer_config.json",
             R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(ChatTemplate::for_model(dir.str())->render(in), "D");

  write_text(dir / "chat_template.jinja", "from the .jinja file\n");  // takes precedence; trailing newline dropped
  EXPECT_EQ(ChatTemplate::for_model(dir.str())->render(in), "from the .jinja file");
  EXPECT_EQ(ChatTemplate::for_model(dir.str())->origin(), dir / "chat_template.jinja");

  write_text(dir / "override.jinja", "{{ eos_token }}");
  std::filesystem::remove(dir / "chat_template.jinja");
  write_text(dir / "tokenizer_config.json", R"({"eos_token": "E"})");
  EXPECT_EQ(ChatTemplate::from_file(dir / "override.jinja", dir.str()).render(in), "E");
}

TEST(ChatTemplate, BadFilesAndTemplatesAreRefusedByName) {
  TempDir dir;
  write_text(dir / "tokenizer_config.json", "{not json");
  expect_error([&] { ChatTemplate::for_model(dir.str()); }, {"tokenizer_config.json", "not a JSON object"});
  write_text(dir / "tokenizer_config.json", R"({"chat_template": 7})");
  expect_error([&] { ChatTemplate::for_model(dir.str()); }, {"chat_template", "string or a list"});
  write_text(dir / "tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  expect_error([&] { ChatTemplate::for_model(dir.str()); }, {"\"default\""});
  write_text(dir / "tokenizer_config.json", R"({"chat_template": "{% for x in y %}"})");
  expect_error([&] { ChatTemplate::for_model(dir.str()); }, {"tokenizer_config.json", "line 1", "endfor"});
  write_text(dir / "tokenizer_config.json", R"({"chat_template": "{% extends 'base' %}"})");
  expect_error([&] { ChatTemplate::for_model(dir.str()); }, {"'extends' is not supported"});
  expect_error([&] { ChatTemplate::from_file(dir / "missing.jinja", dir.str()); }, {"missing.jinja", "no such file"});
}

TEST(ChatTemplate, RenderErrorsNameTheLineAndTheProblem) {
  ChatInput in;
  in.messages_json = R"([{"role": "user", "content": "hi"}])";
  expect_error([&] { from_source("a\nb\n{{ nothing.here }}").render(in); }, {"line 3", "'nothing' is undefined"});
  expect_error([&] { from_source("{{ messages[0].content.append('x') }}").render(in); }, {"'append' is not supported"});
  expect_error([&] { from_source("{{ messages|tojson(ensure_ascii=true) }}").render(in); }, {"ensure_ascii"});
  expect_error([&] { from_source("{{ x }}").render(ChatInput{"{}", "", "", true}); }, {"messages must be a JSON list"});
  expect_error([&] { from_source("{{ x }}").render(ChatInput{"[", "", "", true}); }, {"malformed JSON"});
  expect_error(
      [&] {
        from_source("{{ x }}").render(ChatInput{"[]", "", R"({"messages": 1})", true});
      },
      {"'messages' cannot be set"});
  EXPECT_EQ(from_source("{{ enable_thinking }}").render(ChatInput{"[]", "", R"({"enable_thinking": false})", true}),
            "False");
}

TEST(ChatTemplate, RunawayTemplatesStopAtTheLimits) {
  ChatInput in;
  expect_error(
      [&] {
        from_source("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").render(in);
      },
      {"runs too long"});
  expect_error([&] { from_source("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").render(in); },
               {"nested too deep"});
  expect_error([&] { from_source("{{ range(10000000) }}").render(in); }, {"range too long"});
  expect_error([&] { from_source("{% set s = 'x' * 40000000 %}{{ s ~ s }}").render(in); }, {"exceeds"});
}

}  // namespace
}  // namespace fp4kv::model
