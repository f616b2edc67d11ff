// Rendering of a decode-attention sweep from its JSON (see report.h). Every number shown
// is read from the JSON, never recomputed from the measurements, except the SDPA TB/s of
// the PERF.md tables (SDPA reads the bf16 preset's KV bytes) and the SDPA line of the plot
// (SDPA's speedup over our bf16 kernel).
#include "bench/report.h"

#include "bench/report_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4kv/core/error.h"

namespace fp4kv::bench {

namespace {

using nlohmann::json;
using detail::field;
using detail::fmt;
using detail::int_field;
using detail::number_field;
using detail::string_field;
using detail::xml_text;

SweepPoint parse_point(const json& e, const std::string& where) {
  require(e.is_object(), where + ": must be an object, got " + e.dump());
  SweepPoint p;
  p.shape = string_field(e, "shape", where);
  p.preset = string_field(e, "preset", where);
  p.context = int_field(e, "context", where);
  p.batch = int_field(e, "batch", where);
  require(p.context >= 1 && p.batch >= 1, where + ": context and batch must be positive");
  if (e.contains("skipped")) {
    p.skipped = true;
    p.note = string_field(e, "skipped", where);
    return p;
  }
  p.us = number_field(e, "us", where);
  p.kv_bytes = number_field(e, "kv_bytes", where);
  p.tbs = number_field(e, "tbs", where);
  p.read_fraction = number_field(e, "read_fraction", where);
  p.x_bf16 = number_field(e, "x_bf16", where);
  p.splits = int_field(e, "splits", where);
  p.copies = int_field(e, "copies", where);
  if (e.contains("sdpa_us")) p.sdpa_us = number_field(e, "sdpa_us", where);
  if (e.contains("x_sdpa")) p.x_sdpa = number_field(e, "x_sdpa", where);
  return p;
}

// The distinct values of `key` over `points`, in order of first appearance.
template <class T, class Key>
std::vector<T> distinct(const std::vector<SweepPoint>& points, Key key) {
  std::vector<T> out;
  for (const auto& p : points)
    if (std::find(out.begin(), out.end(), key(p)) == out.end()) out.push_back(key(p));
  return out;
}

std::string context_label(int c) { return c % 1024 == 0 ? std::to_string(c / 1024) + "K" : std::to_string(c); }

}  // namespace

Sweep parse_sweep(std::string_view json_text, const std::string& source) {
  const json j = detail::parse_object(json_text, source, "the sweep");
  Sweep s;
  s.date = string_field(j, "date", source);
  s.device = string_field(j, "device", source);
  s.sms = int_field(j, "sms", source);
  s.read_tbs = number_field(j, "read_tbs", source);
  s.copy_tbs = number_field(j, "copy_tbs", source);
  s.runs = int_field(j, "runs", source);
  if (j.contains("sm_mhz")) s.sm_mhz = number_field(j, "sm_mhz", source);
  if (j.contains("device_sms")) {
    s.device_sms = int_field(j, "device_sms", source);
    s.partition_read_tbs = number_field(j, "partition_read_tbs", source);
  }
  require(s.read_tbs > 0, source + ": \"read_tbs\" must be positive");
  const json& pts = field(j, "points", source);
  require(pts.is_array(), source + ": \"points\" must be an array");
  for (size_t i = 0; i < pts.size(); ++i)
    s.points.push_back(parse_point(pts[i], source + ": points[" + std::to_string(i) + "]"));
  return s;
}

std::string sweep_markdown(const Sweep& s) {
  std::ostringstream md;
  std::string partition;  // where the kernels ran on a partition of the SMs
  if (s.device_sms > 0)
    partition = ", kernels on " + std::to_string(s.sms) + " of them (a green context; streaming read from those " +
                fmt("%.2f", s.partition_read_tbs) + " TB/s)";
  md << "Decode attention, one layer, " << s.date << ", " << s.device << " ("
     << (s.device_sms > 0 ? s.device_sms : s.sms) << " SMs). Streaming read " << fmt("%.2f", s.read_tbs)
     << " TB/s, device copy " << fmt("%.2f", s.copy_tbs) << " TB/s (read + write), measured in the same run"
     << partition
     << (s.sm_mhz > 0 ? ", after the SM clock settled at " + fmt("%.0f", s.sm_mhz) + " MHz" : std::string())
     << ". Median of " << s.runs
     << " CUDA-event-timed runs over rotated cache copies. KV MB: pool pages plus BF16 sink/recent rows read. "
        "x bf16: our bf16 kernel's time over this one; x SDPA: PyTorch SDPA bf16 time over this one.\n\n";
  md << "| shape | context | batch | preset | time (us) | KV MB | TB/s | % of read BW | x bf16 | SDPA bf16 (us) | x SDPA "
        "| splits |\n";
  md << "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& p : s.points) {
    if (p.skipped) {
      md << "| " << p.shape << " | " << p.context << " | " << p.batch << " | " << p.preset << " | " << p.note
         << " | | | | | | | |\n";
      continue;
    }
    md << "| " << p.shape << " | " << p.context / 1024 << "K | " << p.batch << " | " << p.preset << " | "
       << fmt("%.1f", p.us) << " | " << fmt("%.1f", p.kv_bytes / 1e6) << " | " << fmt("%.2f", p.tbs) << " | "
       << fmt("%.0f%%", 100 * p.read_fraction) << " | " << fmt("%.2f", p.x_bf16) << " | "
       << (p.sdpa_us > 0 ? fmt("%.1f", p.sdpa_us) : std::string("-")) << " | "
       << (p.sdpa_us > 0 ? fmt("%.2f", p.x_sdpa) : std::string("-")) << " | " << p.splits << " |\n";
  }
  return md.str();
}

namespace {

// The PERF.md row of PyTorch SDPA for one (shape, context): its time and the TB/s it
// reaches on the bf16 preset's KV bytes (what SDPA reads), per batch.
std::string sdpa_row(const std::vector<const SweepPoint*>& sel, const std::vector<int>& batches, double read_tbs) {
  std::string row = "| **PyTorch SDPA bf16** |";
  for (size_t bi = 0; bi < batches.size(); ++bi) {
    const SweepPoint* sdpa = nullptr;  // the last point of the batch that carries an SDPA time
    const SweepPoint* bf16 = nullptr;
    for (const SweepPoint* p : sel) {
      if (p->batch != batches[bi]) continue;
      if (p->sdpa_us > 0) sdpa = p;
      if (!bf16 && p->preset == "bf16") bf16 = p;
    }
    std::string cell;
    if (sdpa) {
      require(bf16 != nullptr, "perf tables: " + sdpa->shape + " context " + std::to_string(sdpa->context) + " batch " +
                                   std::to_string(sdpa->batch) + " has an SDPA time but no bf16 point");
      const double tbs = bf16->kv_bytes / (sdpa->sdpa_us * 1e-6) / 1e12;
      cell = fmt("%.1f", sdpa->sdpa_us) + " us, " + fmt("%.2f", tbs) + " TB/s (" + fmt("%.0f", 100 * tbs / read_tbs) +
             "%)";
    }
    row += " " + cell + " |";
  }
  return row + "\n";
}

std::string preset_row(const std::vector<const SweepPoint*>& sel, const std::vector<int>& batches,
                       const std::string& preset) {
  std::string row = "| " + preset + " |";
  for (int b : batches) {
    const SweepPoint* p = nullptr;
    for (const SweepPoint* q : sel)
      if (q->batch == b && q->preset == preset) {
        p = q;
        break;
      }
    std::string cell;
    if (p) {
      cell = fmt("%.1f", p->us) + " us, " + fmt("%.2f", p->tbs) + " TB/s (" + fmt("%.0f", 100 * p->read_fraction) +
             "%), " + fmt("%.2f", p->x_bf16) + "x" + (p->x_sdpa > 0 ? " / " + fmt("%.2f", p->x_sdpa) + "x" : "");
    }
    row += " " + cell + " |";
  }
  return row + "\n";
}

}  // namespace

std::string perf_tables(const Sweep& s, const std::vector<int>& contexts) {
  std::vector<SweepPoint> measured;
  for (const auto& p : s.points)
    if (!p.skipped) measured.push_back(p);
  const auto shapes = distinct<std::string>(measured, [](const SweepPoint& p) { return p.shape; });
  const auto presets = distinct<std::string>(measured, [](const SweepPoint& p) { return p.preset; });
  std::string out;
  for (const auto& shape : shapes)
    for (int ctx : contexts) {
      std::vector<const SweepPoint*> sel;
      for (const auto& p : measured)
        if (p.shape == shape && p.context == ctx) sel.push_back(&p);
      if (sel.empty()) continue;
      std::vector<int> batches;
      for (const SweepPoint* p : sel) batches.push_back(p->batch);
      std::sort(batches.begin(), batches.end());
      batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
      out += "**" + shape + ", context " + context_label(ctx) +
             "** (time in us; TB/s of its own KV bytes; % of the streaming-read bandwidth; speedup over our bf16 / "
             "over SDPA)\n\n";
      out += "| preset |";
      for (int b : batches) out += " batch " + std::to_string(b) + " |";
      out += "\n|---|";
      for (size_t i = 0; i < batches.size(); ++i) out += "---:|";
      out += "\n";
      const bool has_sdpa = std::any_of(sel.begin(), sel.end(), [](const SweepPoint* p) { return p->sdpa_us > 0; });
      if (has_sdpa) out += sdpa_row(sel, batches, s.read_tbs);
      for (const auto& preset : presets) out += preset_row(sel, batches, preset);
      out += "\n";
    }
  return out;
}

namespace {

// Geometry of the plot, in SVG pixels.
constexpr int kPanelW = 260, kPanelH = 200, kMarginLeft = 50, kMarginTop = 40, kGap = 30;
constexpr int kLegendW = 150, kPanelTitleH = 20;
constexpr const auto& kColors = detail::kSeriesColors;
constexpr size_t kNumColors = detail::kNumSeriesColors;
const std::string kSdpaLine = "sdpa";  // the series of PyTorch SDPA's speedup over our bf16

// What the plot shows: the axes' values in sweep order and the series.
struct Plot {
  std::vector<std::string> shapes, series;
  std::vector<int> batches, contexts;
  double ymax = 1.0;  // whole multiples of our bf16 speed
};

Plot plot_of(const Sweep& s) {
  Plot pl;
  pl.shapes = distinct<std::string>(s.points, [](const SweepPoint& p) { return p.shape; });
  pl.batches = distinct<int>(s.points, [](const SweepPoint& p) { return p.batch; });
  pl.contexts = distinct<int>(s.points, [](const SweepPoint& p) { return p.context; });
  for (const auto& pr : distinct<std::string>(s.points, [](const SweepPoint& p) { return p.preset; }))
    if (pr != "bf16") pl.series.push_back(pr);
  pl.series.push_back(kSdpaLine);
  for (const auto& p : s.points)
    if (!p.skipped) pl.ymax = std::max({pl.ymax, p.x_bf16, p.x_sdpa});
  pl.ymax = std::ceil(pl.ymax);
  return pl;
}

// The value of `series` at point p, or false when p is not on that series' line.
bool series_value(const SweepPoint& p, const std::string& series, double& v) {
  if (p.skipped) return false;
  if (series == kSdpaLine) {
    if (p.preset != "bf16" || p.x_sdpa <= 0) return false;
    v = p.sdpa_us > 0 ? p.us / p.sdpa_us : 0;
    return true;
  }
  if (p.preset != series) return false;
  v = p.x_bf16;
  return true;
}

// One panel: frame, title, grid, context ticks and one path per series with points.
void write_panel(std::ostringstream& o, const Sweep& s, const Plot& pl, size_t si, size_t bi) {
  const int x0 = kMarginLeft + int(bi) * (kPanelW + kGap), y0 = kMarginTop + int(si) * (kPanelH + kGap + kPanelTitleH);
  o << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"" << kPanelW << "\" height=\"" << kPanelH
    << "\" fill=\"none\" stroke=\"#999\"/>\n";
  o << "<text x=\"" << x0 + 4 << "\" y=\"" << y0 - 4 << "\">" << xml_text(pl.shapes[si]) << ", batch "
    << pl.batches[bi] << "</text>\n";
  const double lx0 = std::log2(double(pl.contexts.front())), lx1 = std::log2(double(pl.contexts.back()));
  const auto X = [&](int c) { return x0 + (lx1 > lx0 ? (std::log2(double(c)) - lx0) / (lx1 - lx0) : 0.5) * kPanelW; };
  const auto Y = [&](double v) { return y0 + kPanelH - v / pl.ymax * kPanelH; };
  for (int t = 0; t <= int(pl.ymax); ++t) {
    o << "<line x1=\"" << x0 << "\" x2=\"" << x0 + kPanelW << "\" y1=\"" << Y(t) << "\" y2=\"" << Y(t)
      << "\" stroke=\"" << (t == 1 ? "#444" : "#eee") << "\"/>\n";
    if (bi == 0) o << "<text x=\"" << x0 - 8 << "\" y=\"" << Y(t) + 4 << "\" text-anchor=\"end\">" << t << "x</text>\n";
  }
  for (int c : pl.contexts)
    o << "<text x=\"" << X(c) << "\" y=\"" << y0 + kPanelH + 14 << "\" text-anchor=\"middle\">" << c / 1024
      << "K</text>\n";
  for (size_t li = 0; li < pl.series.size(); ++li) {
    std::string d;
    for (int c : pl.contexts)
      for (const auto& p : s.points) {
        double v = 0;
        if (p.shape == pl.shapes[si] && p.batch == pl.batches[bi] && p.context == c && series_value(p, pl.series[li], v))
          d += (d.empty() ? "M" : " L") + fmt("%.1f", X(c)) + "," + fmt("%.1f", Y(v));
      }
    if (!d.empty())
      o << "<path d=\"" << d << "\" fill=\"none\" stroke=\"" << kColors[li % kNumColors] << "\" stroke-width=\"1.6\""
        << (pl.series[li] == kSdpaLine ? " stroke-dasharray=\"4,3\"" : "") << "/>\n";
  }
}

void write_legend(std::ostringstream& o, const Plot& pl) {
  const int lx = kMarginLeft + int(pl.batches.size()) * (kPanelW + kGap);
  for (size_t li = 0; li < pl.series.size(); ++li) {
    const bool sdpa = pl.series[li] == kSdpaLine;
    const int y = kMarginTop + 10 + int(li) * 16;
    o << "<line x1=\"" << lx << "\" x2=\"" << lx + 20 << "\" y1=\"" << y << "\" y2=\"" << y << "\" stroke=\""
      << kColors[li % kNumColors] << "\" stroke-width=\"2\"" << (sdpa ? " stroke-dasharray=\"4,3\"" : "")
      << "/>\n<text x=\"" << lx + 26 << "\" y=\"" << y + 4 << "\">"
      << (sdpa ? std::string("PyTorch SDPA bf16") : xml_text(pl.series[li])) << "</text>\n";
  }
  o << "<text x=\"" << lx << "\" y=\"" << kMarginTop + 20 + int(pl.series.size()) * 16
    << "\">y: speedup over our bf16 kernel</text>\n";
}

}  // namespace

std::string speedup_svg(const Sweep& s) {
  require(!s.points.empty(), "speedup plot: the sweep has no points");
  const Plot pl = plot_of(s);
  const int W = kMarginLeft + int(pl.batches.size()) * (kPanelW + kGap) + kLegendW;
  const int H = kMarginTop + int(pl.shapes.size()) * (kPanelH + kGap + kPanelTitleH) + kPanelTitleH;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << kMarginLeft << "\" y=\"18\" font-size=\"14\">"
    << xml_text("fp4kv decode attention: speedup over our bf16 kernel, " + s.device + ", " + s.date) << "</text>\n";
  for (size_t si = 0; si < pl.shapes.size(); ++si)
    for (size_t bi = 0; bi < pl.batches.size(); ++bi) write_panel(o, s, pl, si, bi);
  write_legend(o, pl);
  o << "</svg>\n";
  return o.str();
}

}  // namespace fp4kv::bench
