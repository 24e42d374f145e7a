// Distillation is an Objective, so it runs under every strategy: a student distilled from two
// teachers for N steps under Mirrored, CentralStorage and MultiWorkerMirrored (a local group
// standing in for processes) equals the student distilled on one device (1e-5 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "common/training.h"
#include "hpm/comm/local.h"
#include "hpm/dist/strategy.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/layers.h"

namespace hpm::distill {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<const Distiller> two_teachers() {
  manual_seed(21);
  std::vector<Teacher> t{{testing::small_model(), 1.0f}, {testing::small_model(), 3.0f}};
  return std::make_shared<Distiller>(t, DistillOptions{0.7f, 2.0f});
}

std::vector<float> distill(dist::Strategy& s, const nn::Objective& objective, int steps) {
  manual_seed(7);
  s.scope(testing::small_model, testing::sgd);
  for (int k = 0; k < steps; ++k) {
    const testing::Batch b = testing::random_batch(24, 50 + static_cast<std::uint64_t>(k));
    const dist::StepResult r = s.train_step({b.x, b.y}, objective, 0.0f);
    EXPECT_TRUE(r.finite);
    EXPECT_EQ(r.samples, 24);
  }
  return testing::flat_parameters(*s.model());
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  testing::expect_same_parameters(a, b, what, 1e-5f);
}

TEST(DistillUnderStrategies, EqualsOneDevice) {
  const DistillationObjective objective(two_teachers());
  const auto ref = distill(*dist::make_one_device(), objective, 5);
  dist::StrategyOptions o;
  o.replicas = 2;
  o.threads = 2;
  expect_close(ref, distill(*dist::make_mirrored(o), objective, 5), "mirrored x2");
  o.replicas = 3;  // 24 rows as 8/8/8
  expect_close(ref, distill(*dist::make_mirrored(o), objective, 5), "mirrored x3");
  o.replicas = 2;
  expect_close(ref, distill(*dist::make_central_storage(o), objective, 5), "central storage");

  auto workers = comm::make_local_group(2, 20s);
  std::vector<std::vector<float>> got(2);
  testing::on_workers(2, 7, [&](int w) {
    auto s = dist::make_multi_worker_mirrored(workers[static_cast<std::size_t>(w)], {});
    s->scope(testing::small_model, testing::sgd);
    for (int k = 0; k < 5; ++k) {
      const testing::Batch b = testing::random_batch(24, 50 + static_cast<std::uint64_t>(k));
      s->train_step({b.x, b.y}, objective, 0.0f);
    }
    got[static_cast<std::size_t>(w)] = testing::flat_parameters(*s->model());
  });
  expect_close(ref, got[0], "multi-worker mirrored");
  EXPECT_EQ(got[0], got[1]);
  EXPECT_NE(ref, ([] {
              manual_seed(7);
              return testing::flat_parameters(*testing::small_model());
            })())
      << "nothing trained";
}

}  // namespace
}  // namespace hpm::distill
