// `hpm ps bench`'s library half: a pull and a push of each size through a parameter server on
// loopback, timed.
#include "hpm/distribute/ps/loopback_bench.h"

#include <gtest/gtest.h>

namespace hpm::distribute::ps {
namespace {

TEST(PsLoopbackBench, TimesAPullAndAPushOfEverySize) {
  const auto rows = time_push_pull({4096, 1 << 20}, 3);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].bytes, 4096);
  EXPECT_EQ(rows[1].bytes, 1 << 20);
  for (const auto& r : rows) {
    EXPECT_EQ(r.repeats, 3);
    EXPECT_GT(r.pull_s_median, 0.0);
    EXPECT_GT(r.push_s_median, 0.0);
  }
}

}  // namespace
}  // namespace hpm::distribute::ps
