// `fp4kv generate` as a user runs it: the streamed text on stdout, the statistics on
// stderr, the same text for the same seed, and a clear error for each bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../model/fixtures.h"
#include "cli.h"

namespace fp4kv::test {
namespace {

const std::string kModel = std::string(FP4KV_SOURCE_DIR) + "/models/pk8l";

TEST(CliGenerate, StreamsTextThenPrintsStatisticsOnStderr) {
  const std::string base = cli_path() + " generate --model " + kModel + " --prompt 'The cat sat on the' --max-tokens 12";
  const CliResult out = run_cli_in_shell(base + " 2>/dev/null");
  ASSERT_EQ(out.code, 0) << out.output;
  EXPECT_FALSE(out.output.empty());
  EXPECT_EQ(out.output.find("[fp4kv generate]"), std::string::npos) << "statistics belong on stderr";
  const CliResult err = run_cli_in_shell(base + " 2>&1 >/dev/null");
  ASSERT_EQ(err.code, 0) << err.output;
  for (const char* what : {"prompt 19 tokens", "prefill", "ms per output token", "tokens/s", "kv nvfp4"})
    EXPECT_NE(err.output.find(what), std::string::npos) << what << " missing in: " << err.output;
}

TEST(CliGenerate, SameSeedSameTextAcrossRuns) {
  const std::string args = "generate --model " + kModel +
                           " --prompt 'Once upon a time' --max-tokens 10 --temperature 1.2 --top-p 0.9 --seed 7 "
                           "--kv mxfp4-native 2>/dev/null";
  const CliResult a = run_cli(args), b = run_cli(args);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
}

TEST(CliGenerate, PromptFromAFile) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / "fp4kv_generate_prompt.txt";
  std::ofstream(p) << "The cat sat on the";
  const CliResult a = run_cli("generate --model " + kModel + " --prompt-file " + p.string() + " --max-tokens 6 2>/dev/null");
  const CliResult b = run_cli("generate --model " + kModel + " --prompt 'The cat sat on the' --max-tokens 6 2>/dev/null");
  std::filesystem::remove(p);
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
}

TEST(CliGenerate, BadInputsGetClearErrors) {
  const std::string m = "generate --model " + kModel + " ";
  const struct {
    std::string args, message;
  } cases[] = {
      {m + "--prompt hi --kv nvfp5", "nvfp5"},
      {m + "--prompt ''", "prompt is empty"},
      {m, "--prompt"},
      {m + "--prompt hi --prompt-file /etc/hostname", "one"},
      {m + "--prompt hi --max-tokens 0", "--max-tokens"},
      {m + "--prompt hi --max-tokens 40000", "context"},
      {m + "--prompt hi --temperature -1", "temperature"},
      {m + "--prompt hi --top-p 1.5", "top_p"},
      {m + "--prompt hi --device tpu", "--device"},
      {m + "--prompt-file /tmp", "directory"},
      {"generate --model /nonexistent --prompt hi", "/nonexistent"},
      {m + "--prompt hi --tensor-parallel 0", "at least 1"},
      {m + "--prompt hi --prefill-chunk 0", "--prefill-chunk"},
      {m + "--prompt hi --gemm-plans fast", "--gemm-plans"},
      // pk8l's 8 heads and 2 KV heads do not split 3 ways; 2 ways they do, but not on the CPU
      {m + "--prompt hi --tensor-parallel 3", "num_key_value_heads 2"},
      {m + "--prompt hi --tensor-parallel 2 --device cpu", "the CPU engine runs on one machine"},
  };
  for (const auto& c : cases) {
    const CliResult r = run_cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

// A checkpoint with a subword vocabulary generates through the tokenizer.json beside it (here
// random weights of small_config's shape sized to the BPE test tokenizer): the prompt is its
// BPE tokens, not its bytes; without tokenizer.json the error names the file. `calibrate`
// reads its prompts with the same tokenizer, and its file lets `--kv nvfp4` generate.
TEST(CliGenerate, ASubwordCheckpointUsesItsTokenizerJson) {
  const nlohmann::json cases = model::testing::read_bpe_fixture("tiny_bpe_cases.json");
  const nlohmann::json& hello = cases["encode"][1];
  ASSERT_EQ(hello["text"], "Hello, world!");
  model::testing::TempDir dir;
  model::testing::write_bpe_checkpoint(dir.str(), /*with_tokenizer=*/false);
  const std::string args = "generate --model " + dir.str() + " --prompt 'Hello, world!' --max-tokens 3 --device cpu --kv bf16";
  const CliResult missing = run_cli(args);
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("tokenizer.json"), std::string::npos) << missing.output;
  model::testing::write_text(dir.str() + "/tokenizer.json",
                             model::testing::read_bpe_fixture("tiny_bpe_tokenizer.json").dump());
  const CliResult r = run_cli_in_shell(cli_path() + " " + args + " 2>&1 >/dev/null");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string prompt = "prompt " + std::to_string(hello["ids"].size()) + " tokens";
  EXPECT_NE(r.output.find(prompt), std::string::npos) << prompt << " missing in: " << r.output;
  const CliResult cal = run_cli("calibrate --model " + dir.str() + " --text " + FP4KV_SOURCE_DIR +
                                "/data/calib.txt --context 256 --continuation 8");
  ASSERT_EQ(cal.code, 0) << cal.output;
  const CliResult nv = run_cli_in_shell(cli_path() + " generate --model " + dir.str() +
                                        " --prompt 'Hello, world!' --max-tokens 3 --device cpu --kv nvfp4 2>&1 >/dev/null");
  ASSERT_EQ(nv.code, 0) << nv.output;
  EXPECT_NE(nv.output.find("kv nvfp4"), std::string::npos) << nv.output;
}

// --chat: the prompt as a user message (after a --system message) through the checkpoint's
// chat template generates exactly what the rendered conversation generates as a plain prompt;
// without a template, or with --system but no --chat, a clear error.
TEST(CliGenerate, ChatRendersThePromptThroughTheTemplate) {
  model::testing::TempDir dir;
  model::testing::write_bpe_checkpoint(dir.str());
  model::testing::write_text(
      dir.str() + "/tokenizer_config.json",
      nlohmann::json{{"chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                       "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}}
          .dump());
  model::testing::write_text(dir.str() + "/rendered.txt",
                             "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello, world!<|im_end|>\n"
                             "<|im_start|>assistant\n");
  const std::string common = cli_path() + " generate --model " + dir.str() + " --max-tokens 4 --device cpu --kv bf16";
  const CliResult chat = run_cli_in_shell(common + " --chat --system 'Be brief.' --prompt 'Hello, world!' 2>" +
                                          dir.str() + "/chat.err");
  const CliResult plain = run_cli_in_shell(common + " --prompt-file " + dir.str() + "/rendered.txt 2>" + dir.str() +
                                           "/plain.err");
  ASSERT_EQ(chat.code, 0) << chat.output;
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_EQ(chat.output, plain.output);  // the generated text
  auto prompt_tokens = [](const std::string& err_file) {
    std::ifstream in(err_file);
    const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = err.find("prompt ");
    return at == std::string::npos ? std::string("none") : err.substr(at, err.find(" tokens", at) - at);
  };
  EXPECT_EQ(prompt_tokens(dir.str() + "/chat.err"), prompt_tokens(dir.str() + "/plain.err"));
  EXPECT_NE(prompt_tokens(dir.str() + "/chat.err"), "none");

  const CliResult none = run_cli("generate --model " + kModel + " --chat --prompt hi --max-tokens 2 --device cpu");
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("has no chat template"), std::string::npos) << none.output;
  const CliResult system =
      run_cli("generate --model " + kModel + " --system s --prompt hi --max-tokens 2 --device cpu");
  EXPECT_EQ(system.code, 2) << system.output;
  EXPECT_NE(system.output.find("--system and --chat-template need --chat"), std::string::npos) << system.output;
}

// --device cuda runs the GPU engine where a device is visible and is a clear error elsewhere
// (never a silent CPU run).
TEST(CliGenerate, DeviceCudaRunsOrNamesTheMissingDevice) {
  const CliResult r = run_cli("generate --model " + kModel + " --prompt hi --max-tokens 3 --device cuda");
  if (r.code == 0) {
    EXPECT_NE(r.output.find("device cuda"), std::string::npos) << r.output;
  } else {
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(r.output.find("no CUDA device") != std::string::npos ||
                r.output.find("this build has no CUDA") != std::string::npos)
        << r.output;
  }
}

}  // namespace
}  // namespace fp4kv::test
