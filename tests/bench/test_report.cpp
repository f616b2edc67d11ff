// The renderer of a decode sweep (bench/report.h) on a small hand-written sweep: the
// expected cells below are worked out by hand from sample_sweep.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "bench/report.h"
#include "fp4kv/core/error.h"
#include "sample_sweep.h"

namespace fp4kv::bench {
namespace {

using Row = std::vector<std::string>;

// The cells of every markdown table row ("| a | b |" -> {"a", "b"}), in order.
std::vector<Row> table_rows(const std::string& md) {
  std::vector<Row> rows;
  std::istringstream in(md);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() < 2 || line.front() != '|' || line.back() != '|') continue;
    Row cells;
    size_t b = 1;
    for (size_t e; (e = line.find('|', b)) != std::string::npos; b = e + 1) {
      std::string c = line.substr(b, e - b);
      const size_t first = c.find_first_not_of(' '), last = c.find_last_not_of(' ');
      cells.push_back(first == std::string::npos ? "" : c.substr(first, last - first + 1));
    }
    rows.push_back(cells);
  }
  return rows;
}

Sweep sample() { return parse_sweep(test::kSampleSweep, "sample.json"); }

TEST(BenchReport, CaptionNamesTheSettledSmClockWhenTheSweepHasIt) {
  EXPECT_EQ(sweep_markdown(sample()).find("SM clock"), std::string::npos);  // older sweeps: no clock recorded
  std::string json = test::kSampleSweep;
  json.replace(json.find("\"runs\""), 6, "\"sm_mhz\": 1980.4, \"runs\"");
  const Sweep s = parse_sweep(json, "clock.json");
  EXPECT_DOUBLE_EQ(s.sm_mhz, 1980.4);
  EXPECT_NE(sweep_markdown(s).find("measured in the same run, after the SM clock settled at 1980 MHz. Median of 15"),
            std::string::npos)
      << sweep_markdown(s);
}

TEST(BenchReport, CaptionNamesThePartitionWhenTheSweepRanOnOne) {
  EXPECT_EQ(sweep_markdown(sample()).find("green context"), std::string::npos);
  std::string json = test::kSampleSweep;
  json.replace(json.find("\"sms\": 132"), 10, "\"sms\": 96, \"device_sms\": 132, \"partition_read_tbs\": 4.2");
  const Sweep s = parse_sweep(json, "partition.json");
  EXPECT_EQ(s.sms, 96);
  EXPECT_EQ(s.device_sms, 132);
  EXPECT_DOUBLE_EQ(s.partition_read_tbs, 4.2);
  const std::string md = sweep_markdown(s);
  EXPECT_EQ(md.rfind("Decode attention, one layer, 2026-12-01, Test GPU (132 SMs). Streaming read 4.50 TB/s, device "
                     "copy 4.00 TB/s (read + write), measured in the same run, kernels on 96 of them (a green "
                     "context; streaming read from those 4.20 TB/s). Median of 15",
                     0),
            0u)
      << md;
  std::string without_probe = test::kSampleSweep;
  without_probe.replace(without_probe.find("\"sms\": 132"), 10, "\"sms\": 96, \"device_sms\": 132");
  EXPECT_THROW(parse_sweep(without_probe, "partition.json"), Error);
}

TEST(BenchReport, SweepMarkdownHasOneRowPerPointInSweepOrder) {
  const std::string md = sweep_markdown(sample());
  EXPECT_EQ(md.rfind("Decode attention, one layer, 2026-12-01, Test GPU (132 SMs). Streaming read 4.50 TB/s, device "
                     "copy 4.00 TB/s",
                     0),
            0u)
      << md;
  EXPECT_NE(md.find("Median of 15 CUDA-event-timed runs"), std::string::npos);
  const std::vector<Row> rows = table_rows(md);
  ASSERT_EQ(rows.size(), 6u) << md;  // header, alignment, 4 points
  EXPECT_EQ(rows[0], (Row{"shape", "context", "batch", "preset", "time (us)", "KV MB", "TB/s", "% of read BW",
                          "x bf16", "SDPA bf16 (us)", "x SDPA", "splits"}));
  EXPECT_EQ(rows[2], (Row{"qwen3-4b", "4K", "8", "bf16", "100.0", "450.0", "4.50", "100%", "1.00", "120.0", "1.20", "4"}));
  EXPECT_EQ(rows[3], (Row{"qwen3-4b", "4K", "8", "nvfp4", "40.0", "126.0", "3.15", "70%", "2.50", "120.0", "3.00", "8"}));
  EXPECT_EQ(rows[4],
            (Row{"qwen3-4b", "128K", "8", "bf16", "3200.0", "14400.0", "4.50", "100%", "1.00", "-", "-", "16"}));
  EXPECT_EQ(rows[5], (Row{"qwen3-4b", "131072", "8", "nvfp4", "skipped: needs 200.0 GB, 140.0 GB free", "", "", "", "",
                          "", "", ""}));
}

TEST(BenchReport, PerfTablesHaveOneRowPerPresetAndOneColumnPerBatch) {
  const std::string md = perf_tables(sample(), {131072, 4096});
  const size_t t128 = md.find("**qwen3-4b, context 128K**"), t4 = md.find("**qwen3-4b, context 4K**");
  ASSERT_NE(t128, std::string::npos) << md;
  ASSERT_NE(t4, std::string::npos) << md;
  EXPECT_LT(t128, t4);  // in the order the contexts were asked for
  const std::vector<Row> r128 = table_rows(md.substr(t128, t4 - t128)), r4 = table_rows(md.substr(t4));
  // 128K: no SDPA time, the skipped nvfp4 point leaves its cell empty.
  ASSERT_EQ(r128.size(), 4u) << md;
  EXPECT_EQ(r128[0], (Row{"preset", "batch 8"}));
  EXPECT_EQ(r128[2], (Row{"bf16", "3200.0 us, 4.50 TB/s (100%), 1.00x"}));
  EXPECT_EQ(r128[3], (Row{"nvfp4", ""}));
  // 4K: SDPA reads the bf16 bytes, 450 MB in 120 us = 3.75 TB/s = 83 % of 4.5 TB/s.
  ASSERT_EQ(r4.size(), 5u) << md;
  EXPECT_EQ(r4[2], (Row{"**PyTorch SDPA bf16**", "120.0 us, 3.75 TB/s (83%)"}));
  EXPECT_EQ(r4[3], (Row{"bf16", "100.0 us, 4.50 TB/s (100%), 1.00x / 1.20x"}));
  EXPECT_EQ(r4[4], (Row{"nvfp4", "40.0 us, 3.15 TB/s (70%), 2.50x / 3.00x"}));
  // A context the sweep does not have gives no table.
  EXPECT_EQ(perf_tables(sample(), {65536}), "");
}

bool fail(std::string* why, const std::string& message) {
  *why = message;
  return false;
}

// A small well-formedness check: every tag is closed in order, attribute values are
// quoted, and text holds no bare '&' (only the entities the renderer writes). Collects the
// element names in document order.
bool well_formed_xml(const std::string& xml, std::vector<std::string>* names, std::string* why) {
  std::vector<std::string> open;
  for (size_t i = 0; i < xml.size();) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      const std::string ent = semi == std::string::npos ? "" : xml.substr(i, semi - i + 1);
      if (ent != "&amp;" && ent != "&lt;" && ent != "&gt;" && ent != "&quot;") return fail(why, "bare &");
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return fail(why, "unclosed tag");
    const std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.find('<') != std::string::npos) return fail(why, "'<' inside a tag");
    if (std::count(tag.begin(), tag.end(), '"') % 2 != 0) return fail(why, "unbalanced quotes in <" + tag + ">");
    if (!tag.empty() && tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return fail(why, "mismatched </" + tag.substr(1) + ">");
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" /"));
    if (name.empty()) return fail(why, "empty tag name");
    names->push_back(name);
    if (tag.back() != '/') open.push_back(name);
  }
  if (!open.empty()) return fail(why, "<" + open.back() + "> never closed");
  return true;
}

TEST(BenchReport, SvgIsWellFormedWithOnePathPerSeries) {
  const std::string svg = speedup_svg(sample());
  std::string why;
  std::vector<std::string> names;
  ASSERT_TRUE(well_formed_xml(svg, &names, &why)) << why << "\n" << svg;
  EXPECT_EQ(names.front(), "svg");
  // One panel (one shape, one batch); series: nvfp4 (bf16 is the baseline) and SDPA.
  EXPECT_EQ(std::count(names.begin(), names.end(), "path"), 2) << svg;
  // Panel at (50, 40), 260 x 200, y up to ceil(3.0) = 3x; 4K is the left end of the
  // log-context axis. nvfp4 at 4K: 2.5x -> y = 240 - 2.5 / 3 * 200 = 73.3; its 128K
  // point was skipped. SDPA over our bf16 at 4K: 100 / 120 = 0.833x -> y = 184.4.
  EXPECT_NE(svg.find("<path d=\"M50.0,73.3\""), std::string::npos) << svg;
  EXPECT_NE(svg.find("<path d=\"M50.0,184.4\""), std::string::npos) << svg;
  EXPECT_NE(svg.find(">qwen3-4b, batch 8</text>"), std::string::npos);
  EXPECT_NE(svg.find("Test GPU, 2026-12-01"), std::string::npos);
}

TEST(BenchReport, SvgEscapesNamesXmlReserves) {
  Sweep s = sample();
  s.device = "GPU <A&B>";
  std::string why;
  std::vector<std::string> names;
  EXPECT_TRUE(well_formed_xml(speedup_svg(s), &names, &why)) << why;
}

void expect_rejected(const std::string& json, const std::string& says) {
  try {
    (void)parse_sweep(json, "bad.json");
    ADD_FAILURE() << "accepted: " << json;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
}

TEST(BenchReport, BadJsonIsRejectedNamingTheField) {
  expect_rejected("{\"date\": ", "bad.json: not valid JSON");
  expect_rejected("[1, 2]", "must be a JSON object");
  std::string no_points = test::kSampleSweep;
  no_points.replace(no_points.find("\"points\""), 8, "\"pts\"");
  expect_rejected(no_points, "missing field \"points\"");
  std::string no_us = test::kSampleSweep;
  no_us.replace(no_us.find("\"us\": 40.0"), 10, "\"u\": 40.0");
  expect_rejected(no_us, "points[1]: missing field \"us\"");
  std::string text_batch = test::kSampleSweep;
  text_batch.replace(text_batch.find("\"batch\": 8"), 10, "\"batch\": \"8\"");
  expect_rejected(text_batch, "points[0]: field \"batch\" must be an integer");
}

}  // namespace
}  // namespace fp4kv::bench
