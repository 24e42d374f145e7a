// Distillation is an Objective, so it runs under every strategy: a student distilled from two
// teachers for N steps under Mirrored, CentralStorage and MultiWorkerMirrored (a local group
// standing in for processes) equals the student distilled on one device (1e-5 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "common/models.h"
#include "common/training.h"
#include "hpm/comm/local.h"
#include "hpm/distill/distiller.h"
#include "hpm/distribute/strategy.h"
#include "hpm/nn/layers.h"

namespace hpm::distill {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<const Distiller> two_teachers() {
  manual_seed(21);
  std::vector<Teacher> t{{testing::small_model(), 1.0f}, {testing::small_model(), 3.0f}};
  return std::make_shared<Distiller>(t, DistillOptions{0.7f, 2.0f});
}

std::vector<float> distill(distribute::Strategy& s, const nn::Objective& objective, int steps) {
  manual_seed(7);
  s.scope(testing::small_model, testing::sgd);
  for (int k = 0; k < steps; ++k) {
    const testing::Batch b = testing::random_batch(24, 50 + static_cast<std::uint64_t>(k));
    const distribute::StepResult r = s.train_step({b.x, b.y}, objective, 0.0f);
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
  const auto ref = distill(*distribute::make_one_device(), objective, 5);
  distribute::StrategyOptions o;
  o.replicas = 2;
  o.threads = 2;
  expect_close(ref, distill(*distribute::make_mirrored(o), objective, 5), "mirrored x2");
  o.replicas = 3;  // 24 rows as 8/8/8
  expect_close(ref, distill(*distribute::make_mirrored(o), objective, 5), "mirrored x3");
  o.replicas = 2;
  expect_close(ref, distill(*distribute::make_central_storage(o), objective, 5), "central storage");

  auto workers = comm::make_local_group(2, 20s);
  std::vector<std::vector<float>> got(2);
  testing::on_workers(2, 7, [&](int w) {
    auto s = distribute::make_multi_worker_mirrored(workers[static_cast<std::size_t>(w)], {});
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

// A GPT student of a wider GPT teacher, language modelling as the base objective (every position
// a row of the KL term): Mirrored's replicas, each running the shared teacher on its rows at the
// same time as the others, equal one device (SGD: Adam would divide the last bits of the
// near-zero gradients of unseen tokens' embeddings by their own size).
TEST(DistillUnderStrategies, LanguageModelEqualsOneDevice) {
  manual_seed(5);
  nn::GPTConfig wide = testing::tiny_gpt_config();
  wide.n_embd = 32;
  auto teacher = std::make_shared<nn::GPT>(wide);
  const DistillationObjective objective(
      std::make_shared<Distiller>(std::vector<Teacher>{{teacher, 1.0f}},
                                  DistillOptions{0.5f, 2.0f}),
      std::make_shared<nn::LanguageModelling>());
  const auto train = [&](distribute::Strategy& s) {
    manual_seed(9);
    s.scope(testing::tiny_gpt, testing::sgd);
    for (int k = 0; k < 4; ++k) {
      const nn::Batch b = testing::token_batch(6, 8, 32, 70 + static_cast<std::uint64_t>(k));
      EXPECT_TRUE(s.train_step(b, objective, 0.0f).finite);
    }
    return testing::flat_parameters(*s.model());
  };
  const auto ref = train(*distribute::make_one_device());
  distribute::StrategyOptions o;
  o.replicas = 2;
  o.threads = 2;
  expect_close(ref, train(*distribute::make_mirrored(o)), "mirrored x2");
  // The teacher's term moved the student: the same steps on the base objective alone differ.
  const nn::LanguageModelling alone;
  manual_seed(9);
  auto s = distribute::make_one_device();
  s->scope(testing::tiny_gpt, testing::sgd);
  for (int k = 0; k < 4; ++k)
    s->train_step(testing::token_batch(6, 8, 32, 70 + static_cast<std::uint64_t>(k)), alone, 0.0f);
  EXPECT_NE(ref, testing::flat_parameters(*s->model()));
}

}  // namespace
}  // namespace hpm::distill
