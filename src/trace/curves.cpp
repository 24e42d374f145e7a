#include "hpm/trace/curves.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>

#include "hpm/trace/svg.h"

namespace hpm::trace {

namespace {

// Colours that stay apart for people with the common colour-vision deficiencies (Okabe-Ito).
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};

// Tick labels: short, and no "0.30000000000000004".
std::string tick_text(double v) {
  if (std::abs(v) < 1e-12) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Where data goes on one panel: the plot box and the data ranges it shows.
struct Frame {
  double left, top, width, height;
  double x0, x1, y0, y1;  // y in log10 when log_y
  bool log_y;
  double sx(double x) const { return left + (x - x0) / (x1 - x0) * width; }
  double sy(double y) const {
    const double v = log_y ? std::log10(y) : y;
    return top + height - (v - y0) / (y1 - y0) * height;
  }
};

void widen_if_flat(double& lo, double& hi) {
  if (hi > lo) return;
  const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.05;
  lo -= pad;
  hi += pad;
}

void render_panel(SvgDocument& svg, const PlotPanel& panel, const PlotStyle& style, double top) {
  std::vector<std::vector<Aggregate>> series;
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin;
  double ymin = xmin, ymax = -xmin;
  for (const PlotSeries& s : panel.series) {
    series.push_back(aggregate_runs(s.runs));
    for (const Aggregate& a : series.back()) {
      if (style.log_y && a.lo <= 0) {
        throw std::invalid_argument("plot '" + panel.title + "': series '" + s.label + "' has " +
                                    tick_text(a.lo) + " at x = " + tick_text(a.x) +
                                    ", which a logarithmic axis cannot show");
      }
      xmin = std::min(xmin, a.x);
      xmax = std::max(xmax, a.x);
      ymin = std::min(ymin, a.lo);
      ymax = std::max(ymax, a.hi);
    }
  }
  if (!std::isfinite(xmin)) {
    throw std::invalid_argument("plot '" + panel.title + "': nothing to draw (no finite values)");
  }
  Frame f{
      72, top + 40,   style.width - 72.0 - 24.0, style.panel_height - 40.0 - 56.0, xmin, xmax, 0,
      0,  style.log_y};
  widen_if_flat(f.x0, f.x1);
  double ylo = style.log_y ? std::log10(ymin) : ymin, yhi = style.log_y ? std::log10(ymax) : ymax;
  widen_if_flat(ylo, yhi);
  const double pad = (yhi - ylo) * 0.05;
  f.y0 = ylo - pad;
  f.y1 = yhi + pad;

  svg.open_group("class=\"panel\"");
  svg.text(style.width / 2.0, top + 24, panel.title,
           "text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\"");
  svg.rect(f.left, f.top, f.width, f.height, "fill=\"none\" stroke=\"#444\"");
  // Grid and ticks.
  for (double t : nice_ticks(f.x0, f.x1, 8)) {
    const double x = f.sx(t);
    svg.line(x, f.top, x, f.top + f.height, "stroke=\"#e5e5e5\"");
    svg.text(x, f.top + f.height + 18, tick_text(t), "text-anchor=\"middle\" font-size=\"12\"");
  }
  std::vector<double> yticks;
  if (style.log_y && f.y1 - f.y0 >= 1) {
    for (double k = std::ceil(f.y0); k <= f.y1; ++k) yticks.push_back(std::pow(10.0, k));
  } else {
    const double lo = style.log_y ? std::pow(10.0, f.y0) : f.y0;
    const double hi = style.log_y ? std::pow(10.0, f.y1) : f.y1;
    for (double t : nice_ticks(lo, hi, 6))
      if (!style.log_y || t > 0) yticks.push_back(t);
  }
  for (double t : yticks) {
    const double y = f.sy(t);
    svg.line(f.left, y, f.left + f.width, y, "stroke=\"#e5e5e5\"");
    svg.text(f.left - 6, y + 4, tick_text(t), "text-anchor=\"end\" font-size=\"12\"");
  }
  svg.text(f.left + f.width / 2, f.top + f.height + 40, panel.x_label,
           "text-anchor=\"middle\" font-size=\"13\"");
  svg.text(0, 0, panel.y_label + (style.log_y ? " (log scale)" : ""),
           "transform=\"translate(18," + SvgDocument::number(f.top + f.height / 2) +
               ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\"");

  // Bands first, so every line stays visible on top of them.
  const auto of_series = [&](const char* cls, std::size_t i) {
    return std::string("class=\"") + cls + "\" data-series=\"" + xml_escape(panel.series[i].label) +
           "\"";
  };
  for (std::size_t i = 0; i < series.size(); ++i) {
    const char* colour = kPalette[i % std::size(kPalette)];
    if (panel.series[i].runs.size() < 2) continue;
    std::vector<std::pair<double, double>> band;
    for (const Aggregate& a : series[i]) band.emplace_back(f.sx(a.x), f.sy(a.hi));
    for (auto it = series[i].rbegin(); it != series[i].rend(); ++it)
      band.emplace_back(f.sx(it->x), f.sy(it->lo));
    svg.poly(
        "polygon", band,
        of_series("spread", i) + " fill=\"" + colour + "\" fill-opacity=\"0.18\" stroke=\"none\"");
  }
  for (std::size_t i = 0; i < series.size(); ++i) {
    const std::string colour = kPalette[i % std::size(kPalette)];
    std::vector<std::pair<double, double>> mean;
    for (const Aggregate& a : series[i]) mean.emplace_back(f.sx(a.x), f.sy(a.mean));
    svg.poly("polyline", mean,
             of_series("mean", i) + " fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"2\"");
    if (series[i].size() <= 40) {
      for (const auto& [x, y] : mean) svg.circle(x, y, 2.5, "fill=\"" + colour + "\"");
    }
  }
  // Legend, top right inside the box.
  double longest = 0;
  for (const PlotSeries& s : panel.series) {
    const std::string text =
        s.label + (s.runs.size() > 1 ? " (mean of " + std::to_string(s.runs.size()) + ")" : "");
    longest = std::max(longest, static_cast<double>(text.size()));
  }
  const double lw = 40 + longest * 7, lh = 8 + 18.0 * static_cast<double>(panel.series.size());
  const double lx = f.left + f.width - lw - 8, ly = f.top + 8;
  svg.rect(lx, ly, lw, lh, "fill=\"white\" fill-opacity=\"0.85\" stroke=\"#bbb\"");
  for (std::size_t i = 0; i < panel.series.size(); ++i) {
    const PlotSeries& s = panel.series[i];
    const double y = ly + 16 + 18.0 * static_cast<double>(i);
    svg.line(
        lx + 8, y - 4, lx + 30, y - 4,
        std::string("stroke=\"") + kPalette[i % std::size(kPalette)] + "\" stroke-width=\"3\"");
    svg.text(lx + 36, y,
             s.label + (s.runs.size() > 1
                            ? " (mean of " + std::to_string(s.runs.size()) + ", band: min-max)"
                            : ""),
             "class=\"legend\" font-size=\"12\"");
  }
  svg.close_group();
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo) || count < 1) return {lo};
  const double raw = (hi - lo) / count;
  const double exponent = std::floor(std::log10(raw));
  const double mag = std::pow(10.0, exponent);
  double m = 1;
  for (double candidate : {1.0, 2.0, 5.0, 10.0}) {
    m = candidate;
    if (m * mag >= raw) break;
  }
  // k * m / 10^-e rather than a running sum, so that 0.3 prints as 0.3.
  const double inverse = exponent < 0 ? std::pow(10.0, -exponent) : 0;
  const auto value = [&](double k) { return inverse > 0 ? k * m / inverse : k * m * mag; };
  std::vector<double> out;
  for (double k = std::ceil(lo / (m * mag)); value(k) <= hi * (1 + 1e-12) + 1e-300; ++k) {
    out.push_back(value(k) == 0 ? 0.0 : value(k));
  }
  return out;
}

std::vector<Aggregate> aggregate_runs(
    const std::vector<std::vector<std::pair<double, double>>>& runs) {
  std::map<double, std::vector<double>> at;
  for (const auto& run : runs)
    for (const auto& [x, y] : run) at[x].push_back(y);
  std::vector<Aggregate> out;
  for (const auto& [x, ys] : at) {
    double sum = 0;
    for (double y : ys) sum += y;
    out.push_back({x, sum / static_cast<double>(ys.size()), *std::min_element(ys.begin(), ys.end()),
                   *std::max_element(ys.begin(), ys.end())});
  }
  return out;
}

std::string render_curves(const std::vector<PlotPanel>& panels, const PlotStyle& style) {
  SvgDocument svg(style.width, style.panel_height * static_cast<double>(panels.size()));
  for (std::size_t i = 0; i < panels.size(); ++i) {
    render_panel(svg, panels[i], style, static_cast<double>(style.panel_height) * i);
  }
  return svg.finish(/*declaration=*/true);
}

}  // namespace hpm::trace
