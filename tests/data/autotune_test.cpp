#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "hpm/data/dataset.h"

namespace hpm::data {
namespace {

// Restores the default budget after each test.
class Autotune : public ::testing::Test {
 protected:
  void TearDown() override { set_autotune_budget({}); }
};

StageStats stage(Iterator& it, const std::string& name) {
  std::vector<StageStats> stats;
  it.stats(stats);
  for (const auto& s : stats)
    if (s.name == name) return s;
  ADD_FAILURE() << "no stage " << name;
  return {};
}

TEST_F(Autotune, ParallelismGrowsWhileTheConsumerWaits) {
  set_autotune_budget({4, 0});
  // 2 ms of (sleeping) work per element and a consumer that does nothing: input-bound.
  const Dataset d = Dataset::range(0, 400).map(
      [](Element e) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        return e;
      },
      MapOptions{kAutotune, true});
  auto it = d.make_iterator();
  Element e;
  std::int64_t n = 0;
  while (it->next(e)) ASSERT_EQ(e[0].to_vector_i64()[0], n++);
  EXPECT_EQ(n, 400);
  const StageStats s = stage(*it, "map");
  EXPECT_TRUE(s.autotuned);
  EXPECT_EQ(s.parallelism, 4) << "AUTOTUNE should use the whole CPU budget for an input-bound map";
}

TEST_F(Autotune, ParallelismStaysLowWhenTheConsumerIsTheBottleneck) {
  set_autotune_budget({4, 0});
  const Dataset d =
      Dataset::range(0, 60).map([](Element e) { return e; }, MapOptions{kAutotune, true});
  auto it = d.make_iterator();
  Element e;
  while (it->next(e)) std::this_thread::sleep_for(std::chrono::milliseconds(4));  // a slow step
  // Far below the budget of 4 that an input-bound map reaches (the test above). Not exactly 1: on
  // a machine loaded by other processes the map's thread can be descheduled for longer than a
  // step once, and then it did look input-bound (seen under ctest -j2).
  EXPECT_LE(stage(*it, "map").parallelism, 2);
}

TEST_F(Autotune, PrefetchKeepsToTheRamBudget) {
  // Elements of 1 MiB, a budget of 3 MiB: the buffer may grow by at most 3 slots however long
  // the consumer waits.
  set_autotune_budget({2, 3 << 20});
  const Dataset d = Dataset::from_generator([](std::int64_t i, Element& out) {
                      if (i >= 120) return false;
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));
                      out = {Tensor::zeros({1 << 18})};  // 1 MiB of float32
                      return true;
                    }).prefetch(kAutotune);
  auto it = d.make_iterator();
  Element e;
  std::int64_t peak_reserved = 0;
  while (it->next(e)) peak_reserved = std::max(peak_reserved, autotune_ram_in_use());
  const StageStats s = stage(*it, "prefetch");
  EXPECT_LE(peak_reserved, 3 << 20);
  EXPECT_LE(s.buffer_size, 1 + 3);
  EXPECT_GE(s.buffer_size, 2) << "an input-bound prefetch should have grown";
  it.reset();
  EXPECT_EQ(autotune_ram_in_use(), 0) << "reservations are returned when the iterator goes";
}

}  // namespace
}  // namespace hpm::data
