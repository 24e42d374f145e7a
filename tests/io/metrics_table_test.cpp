// io::MetricsTable: a metrics CSV's curves, empty cells skipped, the wall clock summed from the
// per-row seconds, and every mistake named with its file, line and column.
#include "hpm/io/metrics_table.h"

#include <gtest/gtest.h>

#include <fstream>

#include "common/temp_dir.h"

namespace hpm::io {
namespace {

TEST(MetricsTable, CurvesSkipEmptyCellsAndSumTheWallClock) {
  hpm::testing::TempDir dir;
  std::ofstream(dir / "m.csv") << "epoch,train_loss,test_loss,seconds\n"
                                  "1,2.0,,1.5\n"
                                  "2,1.0,0.9,2.5\n"
                                  "3,nan,0.8,1.0\n";
  const MetricsTable t = read_metrics_table(dir / "m.csv");
  EXPECT_TRUE(t.has("test_loss"));
  EXPECT_FALSE(t.has("accuracy"));
  using Curve = std::vector<std::pair<double, double>>;
  EXPECT_EQ(t.curve("test_loss", "epoch"), (Curve{{2, 0.9}, {3, 0.8}}));
  EXPECT_EQ(t.curve("train_loss", "epoch", 10.0), (Curve{{10, 2.0}, {20, 1.0}}))
      << "a non-finite value is no point";
  EXPECT_EQ(t.curve("test_loss", "seconds"), (Curve{{4.0, 0.9}, {5.0, 0.8}}))
      << "the seconds of the row without a test loss still count";
}

TEST(MetricsTable, MistakesNameTheFileLineAndColumn) {
  hpm::testing::TempDir dir;
  std::ofstream(dir / "m.csv") << "epoch,train_loss\n1,2.0\n2,abc\n";
  const MetricsTable t = read_metrics_table(dir / "m.csv");
  try {
    t.curve("train_loss", "epoch");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("m.csv: line 3, column 'train_loss'"), std::string::npos)
        << e.what();
  }
  try {
    t.column("test_loss");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("(it has: epoch, train_loss)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_metrics_table(dir / "missing.csv"), std::invalid_argument);
  EXPECT_THROW(read_metrics_table(dir.path()), std::invalid_argument);
}

}  // namespace
}  // namespace hpm::io
