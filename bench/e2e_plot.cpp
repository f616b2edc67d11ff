// The plot of an end-to-end run (e2e_plot.h): two panels, TPOT against context (log2 x) and
// output tokens/s against concurrent requests (log2 x), one colour per preset in the run's
// order, batch 1 solid and larger batches dashed. Every number drawn is read from the JSON.
#include "bench/e2e_plot.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "bench/report_util.h"

namespace fp4kv::bench {

namespace {

using detail::field;
using detail::fmt;
using detail::int_field;
using detail::json;
using detail::number_field;
using detail::string_field;
using detail::xml_text;

constexpr int kPanelW = 320, kPanelH = 220, kMarginLeft = 60, kMarginTop = 50, kGap = 70, kLegendW = 170;
constexpr int kHeight = kMarginTop + kPanelH + 60;

// One line of a panel: its points (x, y) in x order, colour and dash.
struct Series {
  std::string label;
  std::string color;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;
};

struct Panel {
  std::string title, x_label, y_label;
  std::vector<Series> series;
};

std::vector<std::string> presets_of(const E2eRun& r) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& p) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  for (const E2eTpot& t : r.tpot) add(t.preset);
  for (const E2eThroughput& t : r.throughput) add(t.preset);
  return out;
}

std::string color_of(const std::vector<std::string>& presets, const std::string& p) {
  const size_t i = size_t(std::find(presets.begin(), presets.end(), p) - presets.begin());
  return detail::kSeriesColors[i % detail::kNumSeriesColors];
}

Panel tpot_panel(const E2eRun& r, const std::vector<std::string>& presets) {
  Panel pl{"TPOT", "context (tokens)", "ms per output token", {}};
  std::vector<int> batches;
  for (const E2eTpot& t : r.tpot)
    if (std::find(batches.begin(), batches.end(), t.batch) == batches.end()) batches.push_back(t.batch);
  for (int b : batches)
    for (const std::string& p : presets) {
      Series s{p + (batches.size() > 1 ? ", batch " + std::to_string(b) : ""), color_of(presets, p), b != batches[0], {}};
      for (const E2eTpot& t : r.tpot)
        if (t.preset == p && t.batch == b && t.tpot_us > 0) s.points.emplace_back(t.context, t.tpot_us / 1e3);
      std::sort(s.points.begin(), s.points.end());
      if (!s.points.empty()) pl.series.push_back(std::move(s));
    }
  return pl;
}

Panel throughput_panel(const E2eRun& r, const std::vector<std::string>& presets) {
  Panel pl{"throughput", "concurrent requests", "output tokens/s", {}};
  for (const std::string& p : presets) {
    Series s{p, color_of(presets, p), false, {}};
    for (const E2eThroughput& t : r.throughput)
      if (t.preset == p) s.points.emplace_back(t.requests, t.tokens_per_s);
    std::sort(s.points.begin(), s.points.end());
    if (!s.points.empty()) pl.series.push_back(std::move(s));
  }
  return pl;
}

// A round axis maximum: 1, 2 or 5 times a power of ten at or above v.
double nice_max(double v) {
  if (v <= 0) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= v) return m * p;
  return 10 * p;
}

std::string tick_label(double x) {
  if (x >= 1024 && std::fmod(x, 1024) == 0) return fmt("%.0fK", x / 1024);
  return fmt("%g", x);
}

void write_panel(std::ostringstream& o, const Panel& pl, int x0) {
  const int y0 = kMarginTop;
  o << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"" << kPanelW << "\" height=\"" << kPanelH
    << "\" fill=\"none\" stroke=\"#999\"/>\n";
  o << "<text x=\"" << x0 + 4 << "\" y=\"" << y0 - 6 << "\" font-size=\"13\">" << xml_text(pl.title) << "</text>\n";
  std::vector<double> xs;
  double ymax = 0;
  for (const Series& s : pl.series)
    for (const auto& [x, y] : s.points) {
      if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
      ymax = std::max(ymax, y);
    }
  std::sort(xs.begin(), xs.end());
  ymax = nice_max(ymax);
  const double lx0 = std::log2(xs.front()), lx1 = std::log2(xs.back());
  const auto X = [&](double x) { return x0 + (lx1 > lx0 ? (std::log2(x) - lx0) / (lx1 - lx0) : 0.5) * kPanelW; };
  const auto Y = [&](double y) { return y0 + kPanelH - y / ymax * kPanelH; };
  constexpr int kYTicks = 5;
  for (int t = 0; t <= kYTicks; ++t) {
    const double v = ymax * t / kYTicks;
    o << "<line x1=\"" << x0 << "\" x2=\"" << x0 + kPanelW << "\" y1=\"" << Y(v) << "\" y2=\"" << Y(v)
      << "\" stroke=\"#eee\"/>\n<text x=\"" << x0 - 6 << "\" y=\"" << Y(v) + 4 << "\" text-anchor=\"end\">"
      << fmt("%g", v) << "</text>\n";
  }
  for (double x : xs)
    o << "<text x=\"" << X(x) << "\" y=\"" << y0 + kPanelH + 14 << "\" text-anchor=\"middle\">" << tick_label(x)
      << "</text>\n";
  o << "<text x=\"" << x0 + kPanelW / 2 << "\" y=\"" << y0 + kPanelH + 32 << "\" text-anchor=\"middle\">"
    << xml_text(pl.x_label) << "</text>\n";
  o << "<text x=\"" << x0 - 44 << "\" y=\"" << y0 + kPanelH / 2 << "\" transform=\"rotate(-90 " << x0 - 44 << ","
    << y0 + kPanelH / 2 << ")\" text-anchor=\"middle\">" << xml_text(pl.y_label) << "</text>\n";
  for (const Series& s : pl.series) {
    std::string d;
    for (const auto& [x, y] : s.points) d += (d.empty() ? "M" : " L") + fmt("%.1f", X(x)) + "," + fmt("%.1f", Y(y));
    o << "<path d=\"" << d << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.6\""
      << (s.dashed ? " stroke-dasharray=\"4,3\"" : "") << "/>\n";
    for (const auto& [x, y] : s.points)
      o << "<circle cx=\"" << fmt("%.1f", X(x)) << "\" cy=\"" << fmt("%.1f", Y(y)) << "\" r=\"2.5\" fill=\"" << s.color
        << "\"/>\n";
  }
}

void write_legend(std::ostringstream& o, const std::vector<Panel>& panels, int lx) {
  std::vector<std::pair<std::string, std::pair<std::string, bool>>> entries;  // label -> (color, dashed)
  for (const Panel& pl : panels)
    for (const Series& s : pl.series)
      if (std::none_of(entries.begin(), entries.end(), [&](const auto& e) { return e.first == s.label; }))
        entries.push_back({s.label, {s.color, s.dashed}});
  for (size_t i = 0; i < entries.size(); ++i) {
    const int y = kMarginTop + 10 + int(i) * 16;
    o << "<line x1=\"" << lx << "\" x2=\"" << lx + 20 << "\" y1=\"" << y << "\" y2=\"" << y << "\" stroke=\""
      << entries[i].second.first << "\" stroke-width=\"2\""
      << (entries[i].second.second ? " stroke-dasharray=\"4,3\"" : "") << "/>\n<text x=\"" << lx + 26 << "\" y=\""
      << y + 4 << "\">" << xml_text(entries[i].first) << "</text>\n";
  }
}

}  // namespace

E2eRun parse_e2e(std::string_view json_text, const std::string& source) {
  const json j = detail::parse_object(json_text, source, "the e2e run");
  E2eRun r;
  r.model = string_field(j, "model", source);
  r.device = string_field(j, "device", source);
  if (j.contains("tpot")) {
    const json& a = j.at("tpot");
    require(a.is_array(), source + ": \"tpot\" must be an array");
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string where = source + ": tpot[" + std::to_string(i) + "]";
      E2eTpot t{string_field(a[i], "preset", where), int_field(a[i], "context", where), int_field(a[i], "batch", where), 0};
      if (!a[i].contains("note")) t.tpot_us = number_field(a[i], "tpot_us", where);
      require(t.context >= 1 && t.batch >= 1 && t.tpot_us >= 0, where + ": context, batch and tpot_us must be positive");
      r.tpot.push_back(t);
    }
  }
  if (j.contains("throughput")) {
    const json& a = j.at("throughput");
    require(a.is_array(), source + ": \"throughput\" must be an array");
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string where = source + ": throughput[" + std::to_string(i) + "]";
      E2eThroughput t{string_field(a[i], "preset", where), int_field(a[i], "requests", where),
                      number_field(a[i], "output_tokens_per_s", where)};
      require(t.requests >= 1 && t.tokens_per_s >= 0, where + ": requests and output_tokens_per_s must be positive");
      r.throughput.push_back(t);
    }
  }
  return r;
}

std::string e2e_svg(const E2eRun& r) {
  const std::vector<std::string> presets = presets_of(r);
  std::vector<Panel> panels;
  if (std::any_of(r.tpot.begin(), r.tpot.end(), [](const E2eTpot& t) { return t.tpot_us > 0; }))
    panels.push_back(tpot_panel(r, presets));
  if (!r.throughput.empty()) panels.push_back(throughput_panel(r, presets));
  require(!panels.empty(), "e2e plot: the run has no TPOT or throughput points");
  const int width = kMarginLeft + int(panels.size()) * (kPanelW + kGap) + kLegendW;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << kMarginLeft << "\" y=\"20\" font-size=\"14\">"
    << xml_text("fp4kv bench e2e: " + r.model + " on " + r.device) << "</text>\n";
  for (size_t i = 0; i < panels.size(); ++i) write_panel(o, panels[i], kMarginLeft + int(i) * (kPanelW + kGap));
  write_legend(o, panels, kMarginLeft + int(panels.size()) * (kPanelW + kGap) - kGap / 2);
  o << "</svg>\n";
  return o.str();
}

}  // namespace fp4kv::bench
