// The seeds' models under every data-parallel path: a GPT (language modelling) and a ResNet
// (classification, BatchNorm) trained N steps through each strategy equal one device, to float
// reassociation (1e-4 relative, as tests/distribute/strategy_test.cpp). BatchNorm normalizes by the
// rows it sees, so a ResNet on R replicas is compared with one device running the same R
// micro-batches (gradient accumulation): the same statistics, the same arithmetic.
// SGD, not Adam: Adam divides each gradient by its own magnitude, so where the exact gradient is
// zero (attention's key bias) it turns reassociation noise into whole steps, and no two
// summation orders agree there (tests/golden measures that against PyTorch).
#include "common/models.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <utility>

#include "common/training.h"
#include "hpm/comm/local.h"
#include "hpm/distribute/strategy.h"

namespace hpm::distribute {
namespace {

using namespace std::chrono_literals;
using testing::flat_parameters;

struct ModelCase {
  const char* name;
  ModelFactory model;
  std::function<nn::Batch(std::uint64_t)> batch;
  std::shared_ptr<const nn::Objective> objective;
};

ModelCase gpt_case() {
  return {"gpt", testing::tiny_gpt,
          [](std::uint64_t seed) { return testing::token_batch(8, 8, 32, seed); },
          std::make_shared<nn::LanguageModelling>()};
}

ModelCase resnet_case() {
  return {"resnet", testing::tiny_resnet,
          [](std::uint64_t seed) { return testing::image_batch(8, seed); },
          std::make_shared<nn::Classification>()};
}

std::vector<float> train(Strategy& s, const ModelCase& c, int steps) {
  manual_seed(7);
  s.scope(c.model, testing::sgd);
  for (int k = 0; k < steps; ++k) {
    const StepResult r =
        s.train_step(c.batch(100 + static_cast<std::uint64_t>(k)), *c.objective, 1.0f);
    EXPECT_TRUE(r.finite) << c.name;
    EXPECT_GT(r.loss, 0.0) << c.name;
  }
  return flat_parameters(*s.model());
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b,
                  const std::string& what) {
  testing::expect_same_parameters(a, b, what);
}

StrategyOptions replicas(int n, int accumulation = 1) {
  StrategyOptions o;
  o.replicas = n;
  o.threads = n;
  o.accumulation_steps = accumulation;
  return o;
}

TEST(Models, EveryStrategyMatchesOneDevice) {
  for (const ModelCase& c : {gpt_case(), resnet_case()}) {
    SCOPED_TRACE(c.name);
    // The reference: one device; for the ResNet, in the two micro-batches replicas see.
    const bool batch_norm = std::string(c.name) == "resnet";
    const auto ref = train(*make_one_device(replicas(1, batch_norm ? 2 : 1)), c, 4);
    EXPECT_NE(ref, flat_parameters(*([&] {
                manual_seed(7);
                return c.model();
              })()))
        << "nothing trained";
    expect_close(ref, train(*make_mirrored(replicas(2)), c, 4), std::string(c.name) + " mirrored");
    expect_close(ref, train(*make_central_storage(replicas(2)), c, 4),
                 std::string(c.name) + " central storage");
    if (!batch_norm) {
      expect_close(ref, train(*make_one_device(replicas(1, 2)), c, 4),
                   std::string(c.name) + " accumulation 2");
      expect_close(ref, train(*make_mirrored(replicas(2, 2)), c, 4),
                   std::string(c.name) + " mirrored x accumulation 2");
    }
  }
}

// BatchNorm's running statistics as one flat vector, and num_batches_tracked summed over layers.
std::pair<std::vector<float>, std::int64_t> running_statistics(const nn::Module& m) {
  std::pair<std::vector<float>, std::int64_t> out{{}, 0};
  for (const auto& [name, t] : m.named_buffers()) {
    if (t.dtype() == DType::I64) {
      out.second += t.to_vector_i64().at(0);
      continue;
    }
    const std::vector<float> v = t.to_vector();
    out.first.insert(out.first.end(), v.begin(), v.end());
  }
  return out;
}

// Buffers follow every strategy, not only parameters: the primary copy's running statistics are
// what replica 0's forwards left, under central storage as under mirrored (whose primary copy is
// replica 0), and they moved from their initial values (mean 0, variance 1), which is what an
// evaluation or a checkpoint of model() reads.
TEST(Models, CentralStorageKeepsRunningStatisticsAsMirrored) {
  const ModelCase c = resnet_case();
  manual_seed(7);
  const auto initial = running_statistics(*c.model());
  auto mirrored = make_mirrored(replicas(2));
  train(*mirrored, c, 4);
  auto central = make_central_storage(replicas(2));
  train(*central, c, 4);
  const auto want = running_statistics(*mirrored->model());
  const auto got = running_statistics(*central->model());
  ASSERT_FALSE(want.first.empty());
  EXPECT_NE(want.first, initial.first) << "mirrored's running statistics never moved";
  EXPECT_NE(got.first, initial.first) << "central storage's running statistics never moved";
  expect_close(want.first, got.first, "central storage's running statistics");
  EXPECT_GT(want.second, 0);
  EXPECT_EQ(got.second, want.second) << "num_batches_tracked";
}

// Two workers (a local group stands in for gloo between processes; tests/cli trains through
// real processes), each with one replica.
TEST(Models, MultiWorkerMirroredMatchesOneDevice) {
  for (const ModelCase& c : {gpt_case(), resnet_case()}) {
    SCOPED_TRACE(c.name);
    const bool batch_norm = std::string(c.name) == "resnet";
    const auto ref = train(*make_one_device(replicas(1, batch_norm ? 2 : 1)), c, 3);
    auto workers = comm::make_local_group(2, 20s);
    std::vector<std::vector<float>> results(2);
    testing::on_workers(2, 7, [&](int w) {
      auto s = make_multi_worker_mirrored(workers[static_cast<std::size_t>(w)], replicas(1));
      s->scope(c.model, testing::sgd);
      for (int k = 0; k < 3; ++k) {
        const StepResult r =
            s->train_step(c.batch(100 + static_cast<std::uint64_t>(k)), *c.objective, 1.0f);
        EXPECT_TRUE(r.finite);
      }
      results[static_cast<std::size_t>(w)] = flat_parameters(*s->model());
    });
    expect_close(ref, results[0], std::string(c.name) + " multi-worker mirrored");
    EXPECT_EQ(results[0], results[1]) << "workers diverged";
  }
}

TEST(Models, LanguageModellingMetricsAreReducedOverReplicas) {
  const ModelCase c = gpt_case();
  auto s = make_mirrored(replicas(2));
  manual_seed(7);
  s->scope(c.model, testing::sgd);
  const StepResult r = s->train_step(c.batch(1), *c.objective, 0.0f);
  // 8 windows of 8 tokens, none ignored: every token of both replicas is counted once.
  EXPECT_EQ(r.metrics.count("loss"), 64.0);
  EXPECT_EQ(r.metrics.count("token_accuracy"), 64.0);
  EXPECT_NEAR(r.loss, std::log(32.0), 0.2) << "an untrained model is near uniform";
  nn::Metrics shown = r.metrics;
  c.objective->derive(shown);
  EXPECT_NEAR(shown.mean("perplexity"), std::exp(r.loss), 1e-6 * std::exp(r.loss));
}

// A custom loop under strategy.run, as tf.distribute's: each replica computes on its rows, and
// ReplicaContext::all_reduce makes what must agree agree.
TEST(Models, CustomLoopSynchronizesThroughAllReduce) {
  for (const char* kind : {"mirrored", "central_storage", "one_device"}) {
    SCOPED_TRACE(kind);
    const int n = std::string(kind) == "one_device" ? 1 : 3;
    auto s = std::string(kind) == "mirrored"          ? make_mirrored(replicas(n))
             : std::string(kind) == "central_storage" ? make_central_storage(replicas(n))
                                                      : make_one_device();
    manual_seed(7);
    s->scope(testing::tiny_gpt, testing::adamw);
    std::vector<float> seen(static_cast<std::size_t>(n));
    s->run([&](ReplicaContext& ctx) {
      Tensor v = Tensor::from({static_cast<float>(ctx.replica_id_in_sync + 1), 1.0f}, {2});
      ctx.all_reduce(v, comm::ReduceOp::kSum);
      EXPECT_EQ(v.data<float>()[1], static_cast<float>(ctx.num_replicas_in_sync));
      seen[static_cast<std::size_t>(ctx.replica_id_in_sync)] = v.data<float>()[0];
    });
    for (float v : seen) EXPECT_EQ(v, static_cast<float>(n * (n + 1) / 2));
  }
}

}  // namespace
}  // namespace hpm::distribute
