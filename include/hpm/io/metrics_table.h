// A metrics CSV ([train] metrics_csv: one row per epoch or evaluation) read as a table of curves:
// a column against another, or against the wall clock summed from the per-row seconds (what
// `hpm plot` draws).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hpm::io {

struct MetricsTable {
  std::string path;
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::uint64_t> lines;  // each row's line in the file

  bool has(const std::string& name) const;
  // std::invalid_argument naming the file and the columns it has when there is no `name`.
  std::size_t column(const std::string& name) const;
  // Empty cells: nullopt. Anything else must be a number (std::invalid_argument naming the file,
  // line and column).
  std::optional<double> number(std::size_t row, std::size_t col) const;
  // (x * x_scale, y) for the rows where both are given and y is finite. x = "seconds" is the wall
  // clock: the running sum of the seconds column.
  std::vector<std::pair<double, double>> curve(const std::string& y, const std::string& x,
                                               double x_scale = 1.0) const;
};

// std::invalid_argument naming the path when it is missing or not a regular file.
MetricsTable read_metrics_table(const std::string& path);

}  // namespace hpm::io
