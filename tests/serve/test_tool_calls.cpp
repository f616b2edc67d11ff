// Hermes-form tool calls (fp4kv/serve/tool_calls.h): what vLLM's hermes parser takes from a
// reply, and the streamed form giving the same content and calls however the reply is cut.
#include "fp4kv/serve/tool_calls.h"

#include <gtest/gtest.h>

namespace fp4kv::serve {
namespace {

TEST(ToolCalls, BlocksBecomeCallsAndTheTextBeforeThemContent) {
  const ParsedReply p = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>");
  EXPECT_EQ(p.content, "Let me check.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Zürich","days":2})");  // key order kept, UTF-8 as is
  EXPECT_EQ(p.calls[1].name, "f");
  EXPECT_EQ(p.calls[1].arguments, R"({"x": 1})");  // a string stays as the model wrote it

  const ParsedReply unterminated = parse_tool_calls("<tool_call>{\"name\": \"g\"}");
  ASSERT_EQ(unterminated.calls.size(), 1u);
  EXPECT_EQ(unterminated.calls[0].arguments, "{}");
  EXPECT_EQ(unterminated.content, "");
}

TEST(ToolCalls, AnythingElseStaysText) {
  for (const std::string reply : {std::string("no calls here"), std::string("<tool_call>not json</tool_call>"),
                                  std::string("<tool_call>{\"arguments\": {}}</tool_call>"),
                                  std::string("<tool_call>[1, 2]</tool_call>"),
                                  std::string("a<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{</tool_call>")}) {
    const ParsedReply p = parse_tool_calls(reply);
    EXPECT_TRUE(p.calls.empty()) << reply;
    EXPECT_EQ(p.content, reply);
  }
}

// Every cut of a reply into two or three pieces streams to the whole reply's content and calls.
TEST(ToolCalls, AStreamEqualsTheWholeReplyAtEveryCut) {
  for (const std::string reply :
       {std::string("plain text with < and <tool and <tool_cal"),
        std::string("Sure.<tool_call>{\"name\": \"a\"}</tool_call>"),
        std::string("<tool_call>{\"name\": \"b\", \"arguments\": {\"k\": [1]}}</tool_call>"),
        std::string("x <tool_call>broken</tool_call> y")}) {
    const ParsedReply whole = parse_tool_calls(reply);
    for (size_t i = 0; i <= reply.size(); ++i) {
      for (size_t j = i; j <= reply.size(); j += 3) {
        ToolCallStream s;
        std::string content = s.feed(reply.substr(0, i));
        content += s.feed(reply.substr(i, j - i));
        content += s.feed(reply.substr(j));
        const ParsedReply rest = s.finish();
        content += rest.content;
        ASSERT_EQ(content, whole.content) << reply << " cut at " << i << ", " << j;
        ASSERT_EQ(rest.calls.size(), whole.calls.size()) << reply;
        for (size_t k = 0; k < whole.calls.size(); ++k) {
          EXPECT_EQ(rest.calls[k].name, whole.calls[k].name);
          EXPECT_EQ(rest.calls[k].arguments, whole.calls[k].arguments);
        }
      }
    }
  }
  ToolCallStream s;  // text is released as it comes, short of a possible tag start
  EXPECT_EQ(s.feed("Hello <tool"), "Hello ");
  EXPECT_EQ(s.feed("box>"), "<toolbox>");
}

}  // namespace
}  // namespace fp4kv::serve
