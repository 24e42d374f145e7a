#include "hpm/cli/plot.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "hpm/cli/options.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/csv.h"
#include "hpm/trace/curves.h"

namespace hpm::cli {

namespace {

// ---- reading metrics CSVs -------------------------------------------------------------------

struct Table {
  std::string path;
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::uint64_t> lines;

  std::size_t column(const std::string& name) const {
    const auto it = std::find(names.begin(), names.end(), name);
    if (it != names.end()) return static_cast<std::size_t>(it - names.begin());
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument(path + " has no column '" + name + "' (it has: " + known + ")");
  }
  // Empty cells: nullopt. Anything else must be a number.
  std::optional<double> number(std::size_t row, std::size_t col) const {
    const std::string& text = rows[row][col];
    if (text.find_first_not_of(" \t") == std::string::npos) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || std::string(end).find_first_not_of(" \t") != std::string::npos) {
      throw std::invalid_argument(path + ": line " + std::to_string(lines[row]) + ", column '" +
                                  names[col] + "': expected a number, got '" + text + "'");
    }
    return v;
  }
};

Table read_table(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw std::invalid_argument(
        "cannot read metrics file " + path +
        (std::filesystem::exists(path) ? ": not a regular file" : ": no such file"));
  }
  Table t;
  t.path = path;
  io::CsvReader reader(path);
  t.names = reader.column_names();
  std::vector<std::string> fields;
  while (reader.next_fields(fields)) {
    t.rows.push_back(fields);
    t.lines.push_back(reader.line());
  }
  return t;
}

std::vector<std::pair<double, double>> points(const Table& t, const std::string& y,
                                              const std::string& x, double x_scale) {
  const std::size_t ycol = t.column(y);
  const bool wall_clock = x == "seconds";
  const std::size_t xcol = t.column(wall_clock ? "seconds" : x);
  std::vector<std::pair<double, double>> out;
  double elapsed = 0;
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    const std::optional<double> xv = t.number(r, xcol);
    if (wall_clock && xv) elapsed += *xv;
    const std::optional<double> yv = t.number(r, ycol);
    if (!xv || !yv || !std::isfinite(*yv)) continue;
    out.emplace_back((wall_clock ? elapsed : *xv) * x_scale, *yv);
  }
  return out;
}

std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace

CLI::App* add_plot_command(CLI::App& app, PlotCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "plot", "draw loss curves from metrics CSVs ([train] metrics_csv) as an SVG file");
  cmd->add_option("files", o.files, "metrics CSV files, one per run")->required();
  cmd->add_option("-o,--output", o.output, "the .svg file to write")->required();
  cmd->add_option("-y,--column", o.columns,
                  "a column to plot, one chart each (default: test_loss, else train_loss)");
  cmd->add_option("--label", o.labels,
                  "one label per file (runs sharing a label: mean and min-max band), or one")
      ->delimiter(',');
  cmd->add_option("--x", o.x, "epoch (default), seconds (wall clock) or a column");
  cmd->add_option("--x-scale", o.x_scale, "multiplies x (eval_every: steps from evaluations)")
      ->check(positive_number());
  cmd->add_option("--title", o.title, "the charts' title");
  cmd->add_option("--x-label", o.x_label, "the x axis' name (default: from --x)");
  cmd->add_flag("--log-y", o.log_y, "logarithmic y axis");
  return cmd;
}

int run_plot(const PlotCommandOptions& o) {
  if (!o.labels.empty() && o.labels.size() != 1 && o.labels.size() != o.files.size()) {
    throw std::invalid_argument("plot: " + std::to_string(o.labels.size()) + " labels for " +
                                std::to_string(o.files.size()) +
                                " files (give one per file, or one for all)");
  }
  std::vector<Table> tables;
  for (const auto& f : o.files) tables.push_back(read_table(f));
  std::vector<std::string> columns = o.columns;
  if (columns.empty()) {
    const Table& t = tables.front();
    const bool has_test = std::find(t.names.begin(), t.names.end(), "test_loss") != t.names.end() &&
                          !points(t, "test_loss", o.x, o.x_scale).empty();
    columns.push_back(has_test ? "test_loss" : "train_loss");
  }
  std::vector<std::string> order;  // labels in first-seen order
  std::map<std::string, std::vector<std::size_t>> files_of;
  for (std::size_t i = 0; i < tables.size(); ++i) {
    const std::string label =
        o.labels.empty() ? stem(o.files[i]) : o.labels[o.labels.size() == 1 ? 0 : i];
    if (!files_of.count(label)) order.push_back(label);
    files_of[label].push_back(i);
  }
  std::vector<trace::PlotPanel> panels;
  for (const auto& column : columns) {
    trace::PlotPanel panel;
    panel.title = o.title.empty() ? column : o.title + ": " + column;
    panel.y_label = column;
    panel.x_label = o.x == "seconds" ? "wall-clock seconds" : o.x;
    if (o.x_scale != 1.0) {
      char scale[32];
      std::snprintf(scale, sizeof scale, " x %.4g", o.x_scale);
      panel.x_label += scale;
    }
    if (!o.x_label.empty()) panel.x_label = o.x_label;
    for (const auto& label : order) {
      trace::PlotSeries s;
      s.label = label;
      for (std::size_t i : files_of[label]) {
        s.runs.push_back(points(tables[i], column, o.x, o.x_scale));
        if (s.runs.back().empty()) {
          throw std::invalid_argument(o.files[i] + ": column '" + column +
                                      "' holds no value to plot");
        }
      }
      panel.series.push_back(std::move(s));
    }
    panels.push_back(std::move(panel));
  }
  trace::PlotStyle style;
  style.log_y = o.log_y;
  io::write_file_atomic(o.output, trace::render_curves(panels, style));
  std::printf("plotted %zu run(s) in %zu series, %zu chart(s): %s\n", o.files.size(), order.size(),
              panels.size(), o.output.c_str());
  return 0;
}

}  // namespace hpm::cli
