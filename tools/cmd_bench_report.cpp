// `fp4kv bench-report`: renders the JSON of a `fp4kv bench decode` sweep (bench/report.h)
// into its markdown table, the tables of docs/PERF.md and the SVG plot, on any machine (no
// GPU needed). Every output path is checked before anything is read or written.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/report.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "tools/commands.h"
#include "tools/csv_args.h"

namespace fp4kv::cli {

namespace {

struct ReportArgs {
  std::string json, markdown, svg, perf_tables;
  std::string contexts = "131072,4096";  // the contexts docs/PERF.md shows
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(bool(in), "bench-report: --json: cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int run_bench_report(const ReportArgs& a) {
  require(!a.markdown.empty() || !a.svg.empty() || !a.perf_tables.empty(),
          "bench-report: nothing to write: give --markdown, --svg and/or --perf-tables");
  const std::vector<int> contexts = positive_ints(a.contexts, "bench-report: --contexts");
  if (!a.markdown.empty()) check_output_writable(a.markdown, "--markdown");
  if (!a.svg.empty()) check_output_writable(a.svg, "--svg");
  if (!a.perf_tables.empty()) check_output_writable(a.perf_tables, "--perf-tables");
  const bench::Sweep sweep = bench::parse_sweep(read_text(a.json), a.json);
  if (!a.markdown.empty()) write_output_file(a.markdown, bench::sweep_markdown(sweep), "--markdown");
  if (!a.svg.empty()) write_output_file(a.svg, bench::speedup_svg(sweep), "--svg");
  if (!a.perf_tables.empty()) write_output_file(a.perf_tables, bench::perf_tables(sweep, contexts), "--perf-tables");
  for (const std::string* path : {&a.markdown, &a.svg, &a.perf_tables})
    if (!path->empty()) std::printf("wrote %s\n", path->c_str());
  return 0;
}

}  // namespace

Action add_bench_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* sub = app.add_subcommand("bench-report",
                                     "render a `bench decode` sweep's JSON: its markdown table, the docs/PERF.md "
                                     "tables, the SVG speedup plot (no GPU needed)");
  sub->add_option("--json", a->json, "the sweep's JSON (bench decode --json)")->required();
  sub->add_option("--markdown", a->markdown, "write the sweep's markdown table here");
  sub->add_option("--svg", a->svg, "write the SVG plot of speedup against context here");
  sub->add_option("--perf-tables", a->perf_tables, "write the per-shape tables of docs/PERF.md here");
  sub->add_option("--contexts", a->contexts, "contexts of the PERF.md tables, comma-separated")->capture_default_str();
  return [a] { return run_bench_report(*a); };
}

}  // namespace fp4kv::cli
