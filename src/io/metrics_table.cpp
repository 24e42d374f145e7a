#include "hpm/io/metrics_table.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "hpm/io/csv.h"

namespace hpm::io {

bool MetricsTable::has(const std::string& name) const {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::size_t MetricsTable::column(const std::string& name) const {
  const auto it = std::find(names.begin(), names.end(), name);
  if (it != names.end()) return static_cast<std::size_t>(it - names.begin());
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument(path + " has no column '" + name + "' (it has: " + known + ")");
}

std::optional<double> MetricsTable::number(std::size_t row, std::size_t col) const {
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

std::vector<std::pair<double, double>> MetricsTable::curve(const std::string& y,
                                                           const std::string& x,
                                                           double x_scale) const {
  const std::size_t ycol = column(y);
  const bool wall_clock = x == "seconds";
  const std::size_t xcol = column(x);
  std::vector<std::pair<double, double>> out;
  double elapsed = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::optional<double> xv = number(r, xcol);
    if (wall_clock && xv) elapsed += *xv;
    const std::optional<double> yv = number(r, ycol);
    if (!xv || !yv || !std::isfinite(*yv)) continue;
    out.emplace_back((wall_clock ? elapsed : *xv) * x_scale, *yv);
  }
  return out;
}

MetricsTable read_metrics_table(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) {
    throw std::invalid_argument(
        "cannot read metrics file " + path +
        (std::filesystem::exists(path) ? ": not a regular file" : ": no such file"));
  }
  MetricsTable t;
  t.path = path;
  CsvReader reader(path);
  t.names = reader.column_names();
  std::vector<std::string> fields;
  while (reader.next_fields(fields)) {
    t.rows.push_back(fields);
    t.lines.push_back(reader.line());
  }
  return t;
}

}  // namespace hpm::io
