// Strategies and the gradient reducer against the single-device reference: N steps on R replicas
// with global batch B give the parameters of one device with batch B (tolerance: float
// reassociation of the gradient average, 1e-5 relative), runs are bit-identical, and the reducer's
// buckets, no_sync and model check behave as documented.
#include "hpm/distribute/strategy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "common/training.h"
#include "hpm/comm/local.h"
#include "hpm/distribute/reducer.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::distribute {
namespace {

using namespace std::chrono_literals;

using testing::sgd;
using testing::small_model;

using testing::Batch;
using testing::flat_parameters;
constexpr auto loss_fn = testing::cross_entropy_loss;
Batch batch(std::int64_t n, std::uint64_t seed) { return testing::random_batch(n, seed); }

// Trains `steps` steps of batch `global_batch` and returns the primary copy's parameters.
std::vector<float> train(Strategy& s, int steps, std::int64_t global_batch) {
  manual_seed(7);
  s.scope(small_model, sgd);
  for (int k = 0; k < steps; ++k) {
    const Batch b = batch(global_batch, 100 + static_cast<std::uint64_t>(k));
    const StepResult r = s.train_step(b.x, b.y, loss_fn, 0.0f);
    EXPECT_TRUE(r.finite);
    EXPECT_EQ(r.samples, global_batch);
  }
  return flat_parameters(*s.model());
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  float worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (1e-3f + std::abs(a[i])));
  EXPECT_LT(worst, 1e-4f) << what;
  EXPECT_NE(a, flat_parameters(*([] {
              manual_seed(7);
              return small_model();
            })()))
      << what << ": nothing trained";
}

TEST(Strategies, EveryStrategyMatchesOneDevice) {
  const std::vector<float> ref = train(*make_one_device(), 6, 64);
  {
    StrategyOptions o;
    o.replicas = 2;
    o.threads = 2;
    expect_close(ref, train(*make_mirrored(o), 6, 64), "mirrored x2");
  }
  {
    StrategyOptions o;
    o.replicas = 3;  // 64 rows split 21/21/22: the loss weighting keeps the mean exact
    expect_close(ref, train(*make_mirrored(o), 6, 64), "mirrored x3 (uneven)");
  }
  {
    StrategyOptions o;
    o.replicas = 2;
    o.reducer.bucket_bytes = 256;  // many buckets
    o.algorithm = comm::Algorithm::kRing;
    expect_close(ref, train(*make_mirrored(o), 6, 64), "mirrored x2, small buckets, ring");
  }
  {
    StrategyOptions o;
    o.replicas = 2;
    expect_close(ref, train(*make_central_storage(o), 6, 64), "central storage x2");
  }
}

// Two "processes" (a local group stands in for gloo), each with 2 local replicas: the
// hierarchical reduction, the worker's row slice and the cross-worker metrics.
TEST(Strategies, MultiWorkerMirroredMatchesOneDevice) {
  const std::vector<float> ref = train(*make_one_device(), 5, 64);
  for (int local : {1, 2}) {
    auto workers = comm::make_local_group(2, 20s);
    std::vector<std::vector<float>> results(2);
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&, w] {
        Generator init(
            7);  // as manual_seed(7), without racing the other worker on the global generator
        ThreadGeneratorGuard guard(init);
        StrategyOptions o;
        o.replicas = local;
        auto s = make_multi_worker_mirrored(workers[w], o);
        EXPECT_EQ(s->num_replicas_in_sync(), 2 * local);
        s->scope(small_model, sgd);
        for (int k = 0; k < 5; ++k) {
          const Batch b = batch(64, 100 + static_cast<std::uint64_t>(k));
          const StepResult r = s->train_step(b.x, b.y, loss_fn, 0.0f);
          EXPECT_EQ(r.samples, 64);  // metrics cover every worker's rows
        }
        results[w] = flat_parameters(*s->model());
      });
    }
    for (auto& t : threads) t.join();
    expect_close(ref, results[0], "multi-worker mirrored");
    EXPECT_EQ(results[0], results[1]) << "workers diverged";
  }
}

// Workers that read their own shards: worker w gets rows [32w, 32w + 32) of the global batch.
TEST(Strategies, MultiWorkerMirroredWithPerWorkerBatchesMatchesOneDevice) {
  const std::vector<float> ref = train(*make_one_device(), 4, 64);
  auto workers = comm::make_local_group(2, 20s);
  std::vector<std::vector<float>> results(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      Generator init(7);
      ThreadGeneratorGuard guard(init);
      StrategyOptions o;
      o.replicas = 2;
      o.per_worker_batches = true;
      auto s = make_multi_worker_mirrored(workers[w], o);
      s->scope(small_model, sgd);
      for (int k = 0; k < 4; ++k) {
        const Batch b = batch(64, 100 + static_cast<std::uint64_t>(k));
        const StepResult r =
            s->train_step(b.x.narrow(32 * w, 32), b.y.narrow(32 * w, 32), loss_fn, 0.0f);
        EXPECT_EQ(r.samples, 64);
      }
      results[w] = flat_parameters(*s->model());
    });
  }
  for (auto& t : threads) t.join();
  expect_close(ref, results[0], "multi-worker mirrored, per-worker batches");
  EXPECT_EQ(results[0], results[1]);
}

// Each worker's BatchNorm statistics come from its own rows; synchronize() (the Trainer's, before
// it evaluates or saves) makes them their mean on every worker, as tf.distribute reads them. Each
// worker evaluated its own before, and EarlyStopping could stop one worker and not the other.
TEST(Strategies, MultiWorkerMirroredAgreesOnBatchNormStatistics) {
  auto bn_model = [] {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(12, 8),
        std::make_shared<nn::BatchNorm1d>(nn::BatchNormOptions{.num_features = 8}),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 4)});
  };
  auto workers = comm::make_local_group(2, 20s);
  std::vector<std::vector<float>> before(2), after(2);
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      Generator init(7);
      ThreadGeneratorGuard guard(init);
      StrategyOptions o;
      o.per_worker_batches = true;
      auto s = make_multi_worker_mirrored(workers[w], o);
      s->scope(bn_model, sgd);
      for (int k = 0; k < 3; ++k) {
        const Batch b = batch(64, 100 + static_cast<std::uint64_t>(k));
        s->train_step(b.x.narrow(32 * w, 32), b.y.narrow(32 * w, 32), loss_fn, 0.0f);
      }
      auto floats = [&] {
        std::vector<float> out;
        for (const auto& [name, t] : s->model()->named_buffers()) {
          if (t.dtype() != DType::F32) continue;
          const std::vector<float> v = t.to_vector();
          out.insert(out.end(), v.begin(), v.end());
        }
        return out;
      };
      before[w] = floats();
      s->synchronize();
      after[w] = floats();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_FALSE(before[0].empty());
  EXPECT_NE(before[0], before[1]) << "the workers' rows differ, and so do their statistics";
  EXPECT_EQ(after[0], after[1]);
  for (std::size_t i = 0; i < after[0].size(); ++i)
    EXPECT_FLOAT_EQ(after[0][i], 0.5f * (before[0][i] + before[1][i])) << i;
}

// What a checkpoint saves of the replicas' generators: every worker's, in rank order, the same
// list on each worker; set back on workers of the same count, each takes its own.
TEST(Strategies, ReplicaGeneratorsAreGatheredAndSetBackByGlobalIndex) {
  auto workers = comm::make_local_group(2, 20s);
  std::vector<std::vector<Generator::State>> gathered(2);
  // Not std::vector<bool>: its elements share a byte, and the two threads' writes raced (one
  // lost under ASan's timing).
  bool set_back[2] = {false, false};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      Generator init(7);
      ThreadGeneratorGuard guard(init);
      StrategyOptions o;
      o.replicas = 2;
      auto s = make_multi_worker_mirrored(workers[w], o);
      s->scope(small_model, sgd);
      s->run([](ReplicaContext&) { default_generator().next_u64(); });  // each replica draws once
      gathered[w] = s->replica_generator_states();
      auto fresh = make_multi_worker_mirrored(workers[w], o);
      fresh->scope(small_model, sgd);
      set_back[w] = fresh->set_replica_generator_states(gathered[w]);
      EXPECT_FALSE(fresh->set_replica_generator_states({gathered[w][0]}));  // another count
      const std::vector<Generator::State> again = fresh->replica_generator_states();
      for (std::size_t r = 0; r < again.size(); ++r) EXPECT_EQ(again[r].s, gathered[w][r].s) << r;
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(gathered[0].size(), 4u);
  EXPECT_TRUE(set_back[0] && set_back[1]);
  for (std::size_t r = 0; r < 4; ++r) EXPECT_EQ(gathered[0][r].s, gathered[1][r].s) << r;
  EXPECT_NE(gathered[0][0].s, gathered[0][2].s) << "each replica its own stream";
}

TEST(Strategies, MirroredIsBitIdenticalFromRunToRun) {
  StrategyOptions o;
  o.replicas = 2;
  const auto a = train(*make_mirrored(o), 4, 32);
  const auto b = train(*make_mirrored(o), 4, 32);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// Dropout on replica threads draws from each replica's own generator: no shared stream to race
// on, and the same numbers every run.
TEST(Strategies, DropoutReplicasAreDeterministic) {
  auto dropout_model = [] {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(12, 32), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Dropout>(0.3f), std::make_shared<nn::Linear>(32, 4)});
  };
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    StrategyOptions o;
    o.replicas = 2;
    o.seed = 11;
    auto s = make_mirrored(o);
    manual_seed(7);
    s->scope(dropout_model, sgd);
    for (int k = 0; k < 3; ++k) {
      const Batch b = batch(32, 200 + static_cast<std::uint64_t>(k));
      s->train_step(b.x, b.y, loss_fn, 0.0f);
    }
    runs.push_back(flat_parameters(*s->model()));
  }
  EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)));
}

TEST(Strategies, NonFiniteLossUpdatesNothing) {
  StrategyOptions o;
  o.replicas = 2;
  auto s = make_mirrored(o);
  manual_seed(7);
  s->scope(small_model, sgd);
  const auto before = flat_parameters(*s->model());
  Batch b = batch(8, 1);
  for (int i = 0; i < 8; ++i) b.y.data<std::int64_t>()[i] = i < 4 ? 0 : 3;
  // Replica 1 (rows 4-7, all labelled 3) sees a NaN loss; replica 0 a finite one.
  auto nan_for_label_3 = [](const Tensor& logits, const Tensor& labels) {
    Tensor l = cross_entropy(logits, labels);
    return labels.data<std::int64_t>()[0] == 3 ? l * NAN : l;
  };
  const StepResult r = s->train_step(b.x, b.y, nan_for_label_3, 0.0f);
  EXPECT_FALSE(r.finite) << r.loss;
  EXPECT_EQ(before, flat_parameters(*s->model()));
}

TEST(Strategies, RunAndReduce) {
  StrategyOptions o;
  o.replicas = 3;
  auto s = make_mirrored(o);
  s->scope(small_model, sgd);
  std::vector<double> ids(3);
  s->run([&](ReplicaContext& c) {
    ids[static_cast<std::size_t>(c.replica_id_in_sync)] = c.replica_id_in_sync + 1.0;
  });
  EXPECT_EQ(s->reduce(comm::ReduceOp::kSum, ids), 6.0);
  EXPECT_EQ(s->reduce(comm::ReduceOp::kAverage, ids), 2.0);
  EXPECT_EQ(s->reduce(comm::ReduceOp::kMax, ids), 3.0);
  EXPECT_EQ(s->replica_rows(64, 2), std::make_pair(std::int64_t{42}, std::int64_t{22}));
}

// ---------------------------------------------------------------------------------------------
// Reducer

template <typename Fn>
void on_ranks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { fn(r); });
  for (auto& t : threads) t.join();
}

std::vector<float> gradients(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    auto v = p.grad().to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// Each rank's gradient of its own batch (batch_seed + rank) computed locally (synchronization
// off), then again through the reducer: what each rank holds after finalize().
struct Reduced {
  std::vector<std::vector<float>> local, reduced;
  std::vector<ReducerStats> stats;
};
Reduced reduce_on_ranks(const std::vector<std::shared_ptr<nn::Module>>& models,
                        const ReducerOptions& options, std::uint64_t batch_seed) {
  const int n = static_cast<int>(models.size());
  auto comms = comm::make_local_group(n, 20s);
  Reduced out{std::vector<std::vector<float>>(n), std::vector<std::vector<float>>(n),
              std::vector<ReducerStats>(n)};
  on_ranks(n, [&](int r) {
    Reducer reducer(*models[r], comms[r], options);
    out.stats[r] = reducer.stats();
    const Batch b = batch(10, batch_seed + static_cast<std::uint64_t>(r));
    {
      NoSync off(reducer);
      models[r]->zero_grad();
      cross_entropy(models[r]->forward(b.x), b.y).backward();
      out.local[r] = gradients(*models[r]);
    }
    models[r]->zero_grad();
    reducer.prepare_for_backward();
    cross_entropy(models[r]->forward(b.x), b.y).backward();
    reducer.finalize();
    out.reduced[r] = gradients(*models[r]);
  });
  return out;
}

TEST(Reducer, AveragesGradientsAcrossRanksInBucketsAndBroadcastsRankZero) {
  for (bool overlap : {true, false}) {
    const int n = 3;
    std::vector<std::shared_ptr<nn::Module>> models(n);
    for (int r = 0; r < n; ++r) {
      manual_seed(
          static_cast<std::uint64_t>(r));  // different initial values: the reducer must align them
      models[r] = small_model();
    }
    const auto rank0_init = flat_parameters(*models[0]);
    const Reduced g = reduce_on_ranks(models, ReducerOptions{600, overlap}, 50);
    const auto& local_grads = g.local;
    const auto& reduced = g.reduced;
    EXPECT_EQ(flat_parameters(*models[2]), rank0_init);
    EXPECT_GT(g.stats[0].buckets, 3u);  // 600-byte cap: several buckets
    for (std::size_t i = 0; i < reduced[0].size(); ++i) {
      const float mean = (local_grads[0][i] + local_grads[1][i] + local_grads[2][i]) / 3.0f;
      ASSERT_NEAR(reduced[0][i], mean, 1e-6f + 1e-5f * std::abs(mean)) << "element " << i;
      ASSERT_EQ(reduced[0][i], reduced[1][i]);
      ASSERT_EQ(reduced[0][i], reduced[2][i]);
    }
  }
}

// allreduce_dtype = BF16: every gradient is the average within bf16's precision (each replica's
// gradient rounded to bf16, the sum rounded once more), the same on every rank, not the f32
// average bit for bit (so bf16 did travel), and half the bytes.
TEST(Reducer, Bf16BucketsAverageWithinBf16Precision) {
  const int n = 3;
  std::vector<std::shared_ptr<nn::Module>> models(n);
  for (int r = 0; r < n; ++r) {
    manual_seed(3);
    models[r] = small_model();
  }
  ReducerOptions o{600, true};
  o.allreduce_dtype = DType::BF16;
  const Reduced g = reduce_on_ranks(models, o, 70);
  const auto& local_grads = g.local;
  const auto& reduced = g.reduced;
  std::size_t params = 0;
  for (const auto& p : models[0]->parameters()) params += static_cast<std::size_t>(p.numel());
  EXPECT_EQ(g.stats[0].bytes, params * 2);
  std::size_t inexact = 0;
  for (std::size_t i = 0; i < reduced[0].size(); ++i) {
    const float mean = (local_grads[0][i] + local_grads[1][i] + local_grads[2][i]) / 3.0f;
    const float scale =
        (std::abs(local_grads[0][i]) + std::abs(local_grads[1][i]) + std::abs(local_grads[2][i])) /
        3.0f;
    ASSERT_NEAR(reduced[0][i], mean, 1e-2f * scale + 1e-9f) << "element " << i;
    ASSERT_EQ(reduced[0][i], reduced[1][i]);
    ASSERT_EQ(reduced[0][i], reduced[2][i]);
    inexact += reduced[0][i] != mean;
  }
  EXPECT_GT(inexact, reduced[0].size() / 4);

  ReducerOptions bad;
  bad.allreduce_dtype = DType::I64;
  auto one = comm::make_local_group(1, 20s);
  try {
    Reducer r(*models[0], one[0], bad);
    ADD_FAILURE() << "an I64 all-reduce dtype was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("f32 or bf16, not I64"), std::string::npos) << e.what();
  }
}

TEST(Reducer, NoSyncAccumulatesLocallyThenReducesTheSum) {
  auto comms = comm::make_local_group(2, 20s);
  std::vector<std::shared_ptr<nn::Module>> models(2);
  for (auto& m : models) {
    manual_seed(3);
    m = small_model();
  }
  std::vector<std::vector<float>> accumulated(2), synced(2);
  on_ranks(2, [&](int r) {
    // Without overlap: gradients live in the buckets, which an overlapped all-reduce averages in
    // place while backward still runs, and this test reads each rank's own sum before that.
    ReducerOptions serial;
    serial.overlap = false;
    Reducer reducer(*models[r], comms[r], serial);
    const Batch a = batch(6, 10 + static_cast<std::uint64_t>(r)),
                b = batch(6, 20 + static_cast<std::uint64_t>(r));
    models[r]->zero_grad();
    {
      NoSync off(reducer);
      cross_entropy(models[r]->forward(a.x), a.y).backward();
    }
    reducer.prepare_for_backward();
    cross_entropy(models[r]->forward(b.x), b.y).backward();
    accumulated[r] = gradients(*models[r]);  // before finalize: this rank's a + b
    reducer.finalize();
    synced[r] = gradients(*models[r]);
  });
  for (std::size_t i = 0; i < synced[0].size(); ++i) {
    const float mean = (accumulated[0][i] + accumulated[1][i]) / 2.0f;
    ASSERT_NEAR(synced[0][i], mean, 1e-6f + 1e-5f * std::abs(mean));
  }
}

TEST(Reducer, DifferentModelsAreAClearError) {
  auto comms = comm::make_local_group(2, 10s);
  std::vector<std::string> errors(2);
  on_ranks(2, [&](int r) {
    std::shared_ptr<nn::Module> m =
        r == 0 ? small_model()
               : std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                     std::make_shared<nn::Linear>(12, 16), std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Linear>(16, 8)});
    try {
      Reducer reducer(*m, comms[r]);
    } catch (const std::runtime_error& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank 1 holds a different model from rank 0: parameter 2 is 2.weight[8, 16] "
                     "on rank 1 but 2.weight[16, 16] on rank 0"),
              std::string::npos)
        << e;
  }
}

}  // namespace
}  // namespace hpm::distribute
