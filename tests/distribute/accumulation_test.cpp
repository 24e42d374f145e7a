// Gradient accumulation: k micro-batches (the last one smaller) give the update of one batch of the
// same examples, on one device and on every data-parallel strategy (tolerance: float
// reassociation of the per-micro-batch sums, 1e-4 relative on the parameters after several SGD
// steps with momentum, as the strategy tests), and only the last micro-batch all-reduces.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "common/training.h"
#include "hpm/comm/local.h"
#include "hpm/distribute/strategy.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::distribute {
namespace {

using namespace std::chrono_literals;
using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

using testing::sgd;
using testing::small_model;

using testing::flat_parameters;
constexpr auto loss_fn = testing::cross_entropy_loss;
std::pair<Tensor, Tensor> batch(std::int64_t n, std::uint64_t seed) {
  testing::Batch b = testing::random_batch(n, seed);
  return {b.x, b.y};
}

struct TrainedRun {
  std::vector<float> params;
  std::vector<double> losses;
};

TrainedRun train(Strategy& s, int steps, std::int64_t global_batch) {
  manual_seed(7);
  s.scope(small_model, sgd);
  TrainedRun run;
  for (int k = 0; k < steps; ++k) {
    const auto [x, y] = batch(global_batch, 100 + static_cast<std::uint64_t>(k));
    const StepResult r = s.train_step(x, y, loss_fn, 0.0f);
    EXPECT_TRUE(r.finite);
    EXPECT_EQ(r.samples, global_batch);
    run.losses.push_back(r.loss);
  }
  run.params = flat_parameters(*s.model());
  return run;
}

void expect_close(const TrainedRun& ref, const TrainedRun& got, const std::string& what) {
  ASSERT_EQ(ref.params.size(), got.params.size());
  float worst = 0;
  for (std::size_t i = 0; i < ref.params.size(); ++i) {
    worst = std::max(worst,
                     std::abs(ref.params[i] - got.params[i]) / (1e-3f + std::abs(ref.params[i])));
  }
  EXPECT_LT(worst, 1e-4f) << what;
  for (std::size_t k = 0; k < ref.losses.size(); ++k)
    EXPECT_NEAR(ref.losses[k], got.losses[k], 1e-5 * std::abs(ref.losses[k])) << what;
}

TEST(Accumulation, MicroBatchesAreCeilSizedWithASmallerLast) {
  EXPECT_EQ(micro_batches(10, 3), (Ranges{{0, 4}, {4, 4}, {8, 2}}));
  EXPECT_EQ(micro_batches(30, 4), (Ranges{{0, 8}, {8, 8}, {16, 8}, {24, 6}}));
  EXPECT_EQ(micro_batches(5, 4), (Ranges{{0, 2}, {2, 2}, {4, 1}}));
  EXPECT_EQ(micro_batches(7, 1), (Ranges{{0, 7}}));
  EXPECT_TRUE(micro_batches(0, 3).empty());
  EXPECT_THROW(micro_batches(4, 0), std::invalid_argument);
  StrategyOptions o;
  o.accumulation_steps = 0;
  EXPECT_THROW(make_one_device(o), std::invalid_argument);
  EXPECT_THROW(make_one_device()->set_accumulation_steps(-1), std::invalid_argument);
}

TEST(Accumulation, EqualsOneBatchOfTheSameExamplesOnEveryStrategy) {
  const TrainedRun ref = train(*make_one_device(), 4, 30);
  for (int k : {2, 4, 7}) {  // 30 rows: 15+15, 8+8+8+6, 5x5+5 (fewer micro-batches than k)
    StrategyOptions o;
    o.accumulation_steps = k;
    const std::string ks = " k=" + std::to_string(k);
    expect_close(ref, train(*make_one_device(o), 4, 30), "one device" + ks);
    o.replicas = 2;  // 15 rows each: e.g. 4+4+4+3
    expect_close(ref, train(*make_mirrored(o), 4, 30), "mirrored x2" + ks);
    expect_close(ref, train(*make_central_storage(o), 4, 30), "central storage x2" + ks);
  }
  // And accumulation really ran in micro-batches: the result is not bit-identical to one batch.
  StrategyOptions o;
  o.accumulation_steps = 4;
  EXPECT_NE(ref.params, train(*make_one_device(o), 4, 30).params);
}

// Forwards to a communicator and counts the collectives started through it.
class CountingCommunicator final : public comm::Communicator {
 public:
  explicit CountingCommunicator(comm::CommunicatorPtr inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  comm::WorkPtr allreduce(Tensor data, comm::ReduceOp op) override {
    ++allreduces;
    return inner_->allreduce(std::move(data), op);
  }
  comm::WorkPtr reduce_scatter(Tensor input, Tensor output, comm::ReduceOp op) override {
    return inner_->reduce_scatter(std::move(input), std::move(output), op);
  }
  comm::WorkPtr allgather(Tensor input, Tensor output) override {
    return inner_->allgather(std::move(input), std::move(output));
  }
  comm::WorkPtr broadcast(Tensor data, int root) override {
    return inner_->broadcast(std::move(data), root);
  }
  comm::WorkPtr barrier() override { return inner_->barrier(); }
  comm::WorkPtr send(Tensor data, int dst, int tag) override {
    return inner_->send(std::move(data), dst, tag);
  }
  comm::WorkPtr recv(Tensor data, int src, int tag) override {
    return inner_->recv(std::move(data), src, tag);
  }
  std::atomic<int> allreduces{0};

 private:
  comm::CommunicatorPtr inner_;
};

// Two workers of one replica each: the reducer all-reduces through the worker communicator, so
// every collective of a step is counted. Returns worker 0's all-reduces per step.
double allreduces_per_step(int accumulation_steps, std::vector<float>* params) {
  auto group = comm::make_local_group(2, 20s);
  std::vector<std::shared_ptr<CountingCommunicator>> counted;
  for (auto& c : group) counted.push_back(std::make_shared<CountingCommunicator>(c));
  std::vector<int> before(2), after(2);
  std::vector<std::vector<float>> results(2);
  std::vector<std::thread> threads;
  constexpr int kSteps = 3;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      Generator init(7);
      ThreadGeneratorGuard guard(init);
      StrategyOptions o;
      o.reducer.bucket_bytes = 512;  // several buckets per step
      o.accumulation_steps = accumulation_steps;
      auto s = make_multi_worker_mirrored(counted[static_cast<std::size_t>(w)], o);
      s->scope(small_model, sgd);
      before[static_cast<std::size_t>(w)] = counted[static_cast<std::size_t>(w)]->allreduces;
      for (int k = 0; k < kSteps; ++k) {
        const auto [x, y] = batch(30, 100 + static_cast<std::uint64_t>(k));
        s->train_step(x, y, loss_fn, 0.0f);
      }
      after[static_cast<std::size_t>(w)] = counted[static_cast<std::size_t>(w)]->allreduces;
      results[static_cast<std::size_t>(w)] = flat_parameters(*s->model());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[0], results[1]) << "workers diverged";
  *params = results[0];
  return static_cast<double>(after[0] - before[0]) / kSteps;
}

TEST(Accumulation, OnlyTheLastMicroBatchAllReduces) {
  std::vector<float> p1, p3;
  const double one = allreduces_per_step(1, &p1);
  const double three = allreduces_per_step(3, &p3);
  // Per step: one all-reduce per gradient bucket (several, with 512-byte buckets) and one for
  // the step's metrics, whatever the number of micro-batches.
  EXPECT_GT(one, 2.0);
  EXPECT_EQ(three, one);
  float worst = 0;
  for (std::size_t i = 0; i < p1.size(); ++i)
    worst = std::max(worst, std::abs(p1[i] - p3[i]) / (1e-3f + std::abs(p1[i])));
  EXPECT_LT(worst, 1e-4f);
}

}  // namespace
}  // namespace hpm::distribute
