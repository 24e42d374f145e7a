// Curves as SVG, for people to look at (what `hpm plot` draws from metrics CSVs): charts stacked
// vertically, each with axes, ticks at round numbers, a grid, a legend and its series. Runs that
// share a label are one series (the same setting over several seeds): their mean as a line and
// their spread (min to max at each x) as a band, so a reader sees both the trend and how far seeds
// disagree. Drawn with the one SVG writer (svg.h).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace hpm::trace {

// One line (or, with several runs, mean line and min..max band) on a chart.
struct PlotSeries {
  std::string label;
  std::vector<std::vector<std::pair<double, double>>> runs;  // (x, y) points of each run
};

struct PlotPanel {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;
};

struct PlotStyle {
  int width = 760;         // pixels
  int panel_height = 420;  // pixels per chart
  bool log_y = false;
};

// The SVG document: the panels stacked vertically, each with axes, ticks at round numbers, grid,
// a legend and its series. std::invalid_argument when a panel has no point, or with log_y a
// value <= 0.
std::string render_curves(const std::vector<PlotPanel>& panels, const PlotStyle& style);

// At each x any run has, the mean and the extent over the runs that have that x.
struct Aggregate {
  double x, mean, lo, hi;
};
std::vector<Aggregate> aggregate_runs(const std::vector<std::vector<std::pair<double, double>>>&);

// Round tick values covering [lo, hi]: about `count` of them, steps of 1, 2 or 5 times a power of
// ten.
std::vector<double> nice_ticks(double lo, double hi, int count);

}  // namespace hpm::trace
