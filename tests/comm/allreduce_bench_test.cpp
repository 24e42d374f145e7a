// The all-reduce benchmark's library half (comm/allreduce_bench.h): one row per size on threads
// and on forked gloo ranks, and nccl-tests' bandwidth arithmetic.
#include "hpm/comm/allreduce_bench.h"

#include <gtest/gtest.h>

namespace hpm::comm {
namespace {

TEST(AllreduceBench, BandwidthsFollowNcclTests) {
  const AllreduceTiming t{1'000'000, 1e-3};
  EXPECT_DOUBLE_EQ(t.algbw_gbps(), 1.0);
  EXPECT_DOUBLE_EQ(t.busbw_gbps(2), 1.0);  // 2(N-1)/N = 1 for two ranks
  EXPECT_DOUBLE_EQ(t.busbw_gbps(4), 1.5);  // 6/4
  EXPECT_DOUBLE_EQ(t.busbw_gbps(1), 0.0);  // one rank sends nothing
}

TEST(AllreduceBench, ThreadsAndForkedProcessesTimeEverySize) {
  for (const bool processes : {false, true}) {
    const auto rows = processes ? time_allreduces_on_processes(2, Algorithm::kRing, {4096, 65536})
                                : time_allreduces_on_threads(2, Algorithm::kRing, {4096, 65536});
    ASSERT_EQ(rows.size(), 2u) << processes;
    EXPECT_EQ(rows[0].bytes, 4096);
    EXPECT_EQ(rows[1].bytes, 65536);
    for (const auto& r : rows) EXPECT_GT(r.seconds, 0.0);  // how fast is bench/'s business
  }
}

}  // namespace
}  // namespace hpm::comm
