// The curves' arithmetic: round ticks, and runs sharing a label as a mean and a band (the drawing
// itself is checked through hpm plot, tests/cli/plot_test.cpp).
#include "hpm/trace/curves.h"

#include <gtest/gtest.h>

namespace hpm::trace {
namespace {

TEST(Curves, NiceTicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(nice_ticks(0.13, 0.52, 4), (std::vector<double>{0.2, 0.3, 0.4, 0.5}));
  const std::vector<double> t = nice_ticks(-3.7, 1234, 6);
  EXPECT_EQ(t, (std::vector<double>{0, 500, 1000}));
}

TEST(Curves, RunsSharingALabelAreAMeanAndABand) {
  const auto agg = aggregate_runs({{{1, 3}, {2, 2}}, {{1, 5}, {2, 4}, {3, 1}}});
  ASSERT_EQ(agg.size(), 3u);
  EXPECT_DOUBLE_EQ(agg[0].mean, 4);
  EXPECT_DOUBLE_EQ(agg[0].lo, 3);
  EXPECT_DOUBLE_EQ(agg[0].hi, 5);
  EXPECT_DOUBLE_EQ(agg[2].mean, 1);  // only one run reached x = 3
}

}  // namespace
}  // namespace hpm::trace
