#include "hpm/cli/plot.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "hpm/cli/options.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/metrics_table.h"
#include "hpm/trace/curves.h"

namespace hpm::cli {

namespace {

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
  std::vector<io::MetricsTable> tables;
  for (const auto& f : o.files) tables.push_back(io::read_metrics_table(f));
  std::vector<std::string> columns = o.columns;
  if (columns.empty()) {
    const io::MetricsTable& t = tables.front();
    const bool has_test = t.has("test_loss") && !t.curve("test_loss", o.x, o.x_scale).empty();
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
        s.runs.push_back(tables[i].curve(column, o.x, o.x_scale));
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
