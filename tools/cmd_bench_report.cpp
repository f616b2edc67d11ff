// `fp4kv bench-report`: renders the JSON of a `fp4kv bench decode` sweep (bench/report.h)
// into its markdown table, the tables of docs/PERF.md and the SVG plot, or the JSON of a
// `fp4kv bench e2e` run into its SVG plot (bench/e2e_plot.h), on any machine (no GPU
// needed). Every output path is checked before anything is read or written.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/e2e_plot.h"
#include "bench/report.h"
#include "fp4kv/core/error.h"
#include "fp4kv/core/output_file.h"
#include "tools/commands.h"
#include "tools/csv_args.h"

namespace fp4kv::cli {

namespace {

struct ReportArgs {
  std::string json, e2e_json, markdown, svg, perf_tables;
  std::string contexts = "131072,4096";  // the contexts docs/PERF.md shows
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(bool(in), "bench-report: cannot read '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int run_e2e_report(const ReportArgs& a) {
  require(a.markdown.empty() && a.perf_tables.empty(),
          "bench-report: --e2e-json renders only the plot (--svg); --markdown and --perf-tables are for sweeps");
  require(!a.svg.empty(), "bench-report: nothing to write: give --svg");
  check_output_writable(a.svg, "--svg");
  write_output_file(a.svg, bench::e2e_svg(bench::parse_e2e(read_text(a.e2e_json), a.e2e_json)), "--svg");
  std::printf("wrote %s\n", a.svg.c_str());
  return 0;
}

int run_bench_report(const ReportArgs& a) {
  require(a.json.empty() != a.e2e_json.empty(), "bench-report: give one of --json (a sweep) or --e2e-json (an e2e run)");
  if (!a.e2e_json.empty()) return run_e2e_report(a);
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
                                     "render a `bench decode` sweep's JSON (markdown table, docs/PERF.md tables, SVG "
                                     "speedup plot) or a `bench e2e` run's JSON (SVG plot); no GPU needed");
  sub->add_option("--json", a->json, "the sweep's JSON (bench decode --json)");
  sub->add_option("--e2e-json", a->e2e_json, "an e2e run's JSON (bench e2e --json): its plot with --svg");
  sub->add_option("--markdown", a->markdown, "write the sweep's markdown table here");
  sub->add_option("--svg", a->svg, "write the SVG plot here (sweep: speedup against context; e2e: TPOT, throughput)");
  sub->add_option("--perf-tables", a->perf_tables, "write the per-shape tables of docs/PERF.md here");
  sub->add_option("--contexts", a->contexts, "contexts of the PERF.md tables, comma-separated")->capture_default_str();
  return [a] { return run_bench_report(*a); };
}

}  // namespace fp4kv::cli
