// `fp4kv load-test`: a bounded load run or soak against a running server (serve/load_client.h):
// N clients x M streaming completions, some abandoned by their client; prints requests/s,
// tokens/s, p50/p99 TTFT and TPOT and the server's running requests and KV blocks afterwards.
// Exit 1 when a request failed or the server still holds blocks after settling (a soak's
// pass/fail), 0 otherwise.
#include <cstdio>
#include <memory>

#include "fp4kv/core/output_file.h"
#include "fp4kv/serve/load_client.h"
#include "tools/commands.h"
#include "tools/csv_args.h"

namespace fp4kv::cli {

namespace {

struct LoadArgs {
  serve::LoadOptions opt;
  std::string prompts, json;
};

int run_load_test(LoadArgs& a) {
  if (!a.prompts.empty()) a.opt.prompts = split_csv(a.prompts);
  if (!a.json.empty()) check_output_writable(a.json, "--json");
  const serve::LoadReport rep = serve::run_load(a.opt);
  std::fputs(rep.table().c_str(), stdout);
  if (!a.json.empty()) write_output_file(a.json, rep.json(), "--json");
  return rep.failed == 0 && rep.blocks_used_after == 0 && rep.running_after == 0 ? 0 : 1;
}

}  // namespace

Action add_load_test(CLI::App& app) {
  auto a = std::make_shared<LoadArgs>();
  CLI::App* sub = app.add_subcommand("load-test", "Bounded load run / soak against a running fp4kv serve");
  sub->add_option("--host", a->opt.host, "server address")->capture_default_str();
  sub->add_option("--port", a->opt.port, "server port")->capture_default_str();
  sub->add_option("--api-key", a->opt.api_key, "bearer key of the server");
  sub->add_option("--clients", a->opt.clients, "concurrent clients")->capture_default_str()->check(CLI::Range(1, 4096));
  sub->add_option("--requests", a->opt.requests_per_client, "requests per client")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--prompts", a->prompts, "prompts, comma-separated (cycled)");
  sub->add_option("--max-tokens", a->opt.max_tokens, "tokens per request")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  sub->add_option("--temperature", a->opt.temperature, "sampling temperature")->capture_default_str();
  sub->add_option("--cancel-fraction", a->opt.cancel_fraction, "requests whose client leaves after the first event")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--seed", a->opt.seed, "seed of the requests and of the cancels")->capture_default_str();
  sub->add_option("--json", a->json, "also write the report as JSON");
  return [a] { return run_load_test(*a); };
}

}  // namespace fp4kv::cli
