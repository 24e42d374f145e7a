// `hpm plot`: metrics CSVs to SVG. The geometry is checked from the SVG itself (each series' line
// must be the same affine map of its data, the band must span the runs' extremes), labels group
// runs, and every documented error names what is wrong.
#include "hpm/cli/plot.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "common/hpm_cli.h"

namespace hpm {
namespace {

using namespace hpm::testing;

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// The points of the element of `cls` drawn for `series`.
std::vector<std::pair<double, double>> shape_points(const std::string& svg, const std::string& cls,
                                                    const std::string& series) {
  const std::regex re("class=\"" + cls + "\" data-series=\"" + series +
                      "\"[^>]*points=\"([^\"]*)\"");
  std::smatch m;
  if (!std::regex_search(svg, m, re)) return {};
  std::vector<std::pair<double, double>> out;
  std::istringstream in(m[1].str());
  std::string pair;
  while (in >> pair) {
    const auto comma = pair.find(',');
    out.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
  }
  return out;
}

void expect_affine(const std::vector<std::pair<double, double>>& data,
                   const std::vector<std::pair<double, double>>& drawn) {
  ASSERT_EQ(data.size(), drawn.size());
  ASSERT_GE(data.size(), 3u);
  const double sx = (drawn[1].first - drawn[0].first) / (data[1].first - data[0].first);
  const double sy = (drawn[1].second - drawn[0].second) / (data[1].second - data[0].second);
  EXPECT_GT(sx, 0);  // x grows to the right
  EXPECT_LT(sy, 0);  // y grows upwards
  for (std::size_t i = 0; i < data.size(); ++i) {
    EXPECT_NEAR(drawn[i].first, drawn[0].first + sx * (data[i].first - data[0].first), 0.02);
    EXPECT_NEAR(drawn[i].second, drawn[0].second + sy * (data[i].second - data[0].second), 0.02);
  }
}

const char* kHeader =
    "epoch,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples_per_s,"
    "seconds\n";

TEST(Plot, DrawsEachRunAsAnAffineImageOfItsData) {
  TempDir dir;
  write_text(dir / "a.csv", std::string(kHeader) +
                                "1,2.0,0.5,1.9,0.6,0.1,100,2.0\n2,1.5,0.6,,,0.1,100,2.0\n"
                                "3,1.2,0.7,1.3,0.7,0.1,100,3.0\n4,1.0,0.8,1.1,0.75,0.1,100,1.0\n");
  write_text(dir / "b.csv", std::string(kHeader) +
                                "1,2.2,0.5,2.1,0.6,0.1,100,1.0\n2,1.7,0.6,1.6,0.6,0.1,100,1.0\n"
                                "3,1.4,0.7,1.5,0.7,0.1,100,1.0\n");
  const CommandResult r = run_hpm("plot " + dir / "a.csv" + " " + dir / "b.csv" + " -o " +
                                  dir / "p.svg" + " -y test_loss -y train_loss --x seconds");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string svg = read_text(dir / "p.svg");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // test_loss of a: the empty cell is skipped; x is the running sum of seconds.
  expect_affine({{2, 1.9}, {7, 1.3}, {8, 1.1}}, shape_points(svg, "mean", "a"));
  expect_affine({{1, 2.1}, {2, 1.6}, {3, 1.5}}, shape_points(svg, "mean", "b"));
  // The second chart (train_loss) follows in the same document.
  const std::size_t second = svg.find("<g class=\"panel\">", svg.find("<g class=\"panel\">") + 1);
  ASSERT_NE(second, std::string::npos);
  expect_affine({{2, 2.0}, {4, 1.5}, {7, 1.2}, {8, 1.0}},
                shape_points(svg.substr(second), "mean", "a"));
  EXPECT_EQ(svg.find("class=\"spread\""), std::string::npos);  // one run per label: no band
}

TEST(Plot, ALabelSharedBySeedsDrawsTheMeanAndTheMinMaxBand) {
  TempDir dir;
  std::string args;
  const double losses[3][3] = {{3.0, 2.0, 1.5}, {3.2, 2.4, 1.7}, {2.8, 2.2, 1.3}};
  for (int s = 0; s < 3; ++s) {
    std::string text = kHeader;
    for (int e = 0; e < 3; ++e)
      text += std::to_string(e + 1) + ",1,0.5," + std::to_string(losses[s][e]) + ",0.5,0.1,1,1\n";
    write_text(dir / ("seed" + std::to_string(s) + ".csv"), text);
    args += " " + dir / ("seed" + std::to_string(s) + ".csv");
  }
  const CommandResult r = run_hpm("plot" + args + " -o " + dir / "p.svg" +
                                  " --label 'codistilled 2x,codistilled 2x,codistilled 2x'" +
                                  " --x-scale 100 --title 'GPT & co' --x-label 'compute steps'");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string svg = read_text(dir / "p.svg");
  EXPECT_NE(svg.find("GPT &amp; co: test_loss"), std::string::npos);
  EXPECT_NE(svg.find(">compute steps</text>"), std::string::npos);
  EXPECT_NE(svg.find("codistilled 2x (mean of 3, band: min-max)"), std::string::npos);
  expect_affine({{100, 3.0}, {200, 2.2}, {300, 1.5}}, shape_points(svg, "mean", "codistilled 2x"));
  // The band: the maxima left to right, then the minima right to left, on the same map.
  const auto band = shape_points(svg, "spread", "codistilled 2x");
  ASSERT_EQ(band.size(), 6u);
  const auto mean = shape_points(svg, "mean", "codistilled 2x");
  const double sy = (mean[1].second - mean[0].second) / (2.2 - 3.0);
  EXPECT_NEAR(band[0].second - mean[0].second, sy * (3.2 - 3.0), 0.02);
  EXPECT_NEAR(band[5].second - mean[0].second, sy * (2.8 - 3.0), 0.02);
  EXPECT_NEAR(band[1].second - mean[1].second, sy * (2.4 - 2.2), 0.02);
}

TEST(Plot, EveryErrorNamesWhatIsWrong) {
  TempDir dir;
  write_text(dir / "a.csv", std::string(kHeader) + "1,2.0,0.5,1.9,0.6,0.1,100,2.0\n");
  write_text(dir / "bad.csv", std::string(kHeader) + "1,2.0,0.5,1.9,0.6,0.1,100,2.0\n" +
                                  "2,oops,0.5,1.9,0.6,0.1,100,2.0\n");
  write_text(dir / "neg.csv", std::string(kHeader) + "1,-2.0,0.5,,,0.1,100,2.0\n");
  write_text(dir / "empty.csv", kHeader);
  const std::string out = " -o " + dir / "p.svg";
  struct Case {
    std::string args, message;
  } cases[] = {
      {dir / "missing.csv", "cannot read metrics file " + dir / "missing.csv" + ": no such file"},
      {dir.path(), ": not a regular file"},
      {dir / "a.csv -y val_los", "a.csv has no column 'val_los' (it has: epoch, train_loss,"},
      {dir / "a.csv --x step", "has no column 'step'"},
      {dir / "bad.csv -y train_loss",
       "bad.csv: line 3, column 'train_loss': expected a number, got 'oops'"},
      {dir / "a.csv " + dir / "bad.csv --label x,y,z", "plot: 3 labels for 2 files"},
      {dir / "neg.csv -y train_loss --log-y", "which a logarithmic axis cannot show"},
      {dir / "neg.csv -y test_loss", "neg.csv: column 'test_loss' holds no value to plot"},
      {dir / "empty.csv -y train_loss", "empty.csv: column 'train_loss' holds no value to plot"},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_hpm("plot " + c.args + out);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "p.svg"));
}

}  // namespace
}  // namespace hpm
