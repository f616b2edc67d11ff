// The one renderer of a decode-attention sweep: `fp4kv bench decode` measures and writes
// the sweep as JSON; everything a person reads (its markdown table, the per-shape tables of
// docs/PERF.md, the SVG plot of speedup against context) is rendered from that JSON here,
// so a sweep can be re-rendered on any machine (`fp4kv bench-report`). CPU only.
//
// The JSON (as cmd_bench writes it): {"date", "device", "sms", "read_tbs", "copy_tbs",
// "runs", "points": [...]} and, where the sweep ran on a partition of "sms" of the device's
// SMs (`--sms`), "device_sms" and "partition_read_tbs" (read_tbs stays the whole card's);
// each point has "shape", "preset", "context", "batch" and either "skipped" (the reason) or
// "us", "kv_bytes", "tbs", "read_fraction", "x_bf16", "splits", "copies" and optionally
// "sdpa_us", "x_sdpa". The order of the points is the sweep's (shape, context, batch, preset)
// order; the renderers keep it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fp4kv::bench {

struct SweepPoint {
  std::string shape, preset;
  int context = 0, batch = 0;
  bool skipped = false;
  std::string note;  // why it was skipped
  double us = 0, kv_bytes = 0, tbs = 0, read_fraction = 0, x_bf16 = 0;
  int splits = 0, copies = 0;
  double sdpa_us = 0, x_sdpa = 0;  // 0 when the sweep had no SDPA time for this point
};

struct Sweep {
  std::string date, device;
  int sms = 0, runs = 0;
  int device_sms = 0;             // the device's SMs when the sweep ran on a partition (0: it did not)
  double partition_read_tbs = 0;  // the partition's own read probe
  double read_tbs = 0, copy_tbs = 0;  // bandwidths measured in the same run
  double sm_mhz = 0;  // the SM clock settled before timing (0: not recorded, older sweeps)
  std::vector<SweepPoint> points;
};

// Parses the sweep JSON; throws Error naming `source` and the bad or missing field.
Sweep parse_sweep(std::string_view json_text, const std::string& source);

// The sweep's own markdown: a caption (device, bandwidths, method) and one row per point.
std::string sweep_markdown(const Sweep& sweep);

// The tables of docs/PERF.md: for each shape and each of `contexts` the sweep has, one row
// per preset (plus PyTorch SDPA when the sweep has its times), one column per batch.
std::string perf_tables(const Sweep& sweep, const std::vector<int>& contexts);

// SVG plot: speedup over our bf16 kernel against context (log scale), one panel per
// (shape, batch), one line per non-bf16 preset and a dashed one for PyTorch SDPA.
std::string speedup_svg(const Sweep& sweep);

}  // namespace fp4kv::bench
