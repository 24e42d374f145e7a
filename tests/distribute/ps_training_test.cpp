// Parameter-server training against references: one asynchronous worker is one device, step for
// step (bit-identical: the same arithmetic, only moved to the server); synchronous mode with W
// workers is Mirrored with W replicas (tolerance: float reassociation of the gradient average,
// 1e-5 relative); SSP keeps the fastest worker within the bound of the slowest; a parameter server
// lost mid-run is restored from the last checkpoint of all shards and training completes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "common/models.h"
#include "common/temp_dir.h"
#include "common/training.h"
#include "distribute/ps_cluster.h"
#include "hpm/distribute/strategy.h"
#include "hpm/io/atomic_file.h"
#include "hpm/nn/offload.h"
#include "hpm/nn/recompute.h"
#include "hpm/tensor/kernels.h"

namespace hpm::distribute::ps {
namespace {

using namespace testing;
using namespace std::chrono_literals;

OptimizerSpec momentum_sgd() {
  OptimizerSpec o;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  return o;
}

CoordinatorOptions options(Mode mode, std::int64_t epochs, std::int64_t tasks_per_epoch) {
  CoordinatorOptions co;
  co.mode = mode;
  co.epochs = epochs;
  co.tasks_per_epoch = tasks_per_epoch;
  co.optimizer = momentum_sgd();
  co.log = [](const std::string&) {};
  return co;
}

// The reference: `replicas` = 1 is one device; more is Mirrored. Each step trains on the rows the
// PS workers use: parts of the epoch's order.
std::vector<float> reference(
    int replicas, const data::LabelledData& d, std::int64_t epochs, std::int64_t batch,
    std::uint64_t seed, StrategyOptions so = {},
    const std::function<std::shared_ptr<nn::Module>()>& make_model = [] { return small_model(); }) {
  so.replicas = replicas;
  auto strategy = replicas == 1 ? make_one_device(so) : make_mirrored(so);
  strategy->scope(make_model, [](nn::Module& m) {
    return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.1f, 0.9f});
  });
  const std::int64_t global = batch * replicas;
  for (std::int64_t e = 0; e < epochs; ++e) {
    const auto order = epoch_order(d.size(), seed, e);
    for (std::int64_t s = 0; s < d.size() / global; ++s) {
      const std::vector<std::int64_t> rows(order.begin() + s * global,
                                           order.begin() + (s + 1) * global);
      strategy->train_step(
          kernels::index_select0(d.inputs, rows), kernels::index_select0(d.labels, rows),
          [](const Tensor& l, const Tensor& y) { return cross_entropy(l, y); }, 0.0f);
    }
  }
  return flat(strategy->model()->named_parameters());
}

TEST(PsTraining, OneAsyncWorkerIsOneDeviceBitForBit) {
  const auto d = small_data(96);
  Cluster c = loopback_cluster(1);
  auto servers = start_servers(c, 2);
  const RunResult r = run_job(c, options(Mode::kAsync, 2, tasks_per_epoch(96, 16, 1)), d,
                              [](int w) { return WorkerOptions{.worker = w, .batch_size = 16}; });
  const auto ref = reference(1, d, 2, 16, 0);
  ASSERT_EQ(r.params.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(r.params[i], ref[i]) << "parameter " << i;
  EXPECT_EQ(r.report.tasks, 12);
  EXPECT_EQ(r.workers[0].steps, 12);
  EXPECT_EQ(r.workers[0].staleness_histogram[0], 12);  // alone: never stale
}

// A worker's step is the one replica step: mixed precision, gradient accumulation and a model
// wrapped for recomputation or offload reach it, and one asynchronous worker equals one device
// with the same settings, bit for bit.
TEST(PsTraining, AWorkerTrainsInBf16WithAccumulationRecomputeOrOffloadAsOneDevice) {
  const auto d = small_data(96);
  const auto wrapped = [](bool offload) {
    return [offload] {
      auto blocks = nn::as_sequential(small_model());
      nn::OffloadOptions o;
      o.threshold_bytes = 0;
      return offload ? std::shared_ptr<nn::Module>(nn::with_offload(blocks, o))
                     : nn::with_recomputation(blocks, 1, nn::RecomputeMode::Always);
    };
  };
  struct Case {
    const char* name;
    autograd::Precision precision;
    int accumulation;
    std::function<std::shared_ptr<nn::Module>()> model;
  };
  std::vector<Case> cases = {
      {"accumulation", autograd::Precision::F32, 2, [] { return small_model(); }},
      {"recompute", autograd::Precision::F32, 1, wrapped(false)},
      {"offload", autograd::Precision::F32, 1, wrapped(true)}};
  if (kernels::native_bf16()) {
    cases.push_back({"bf16", autograd::Precision::BF16, 1, [] { return small_model(); }});
    cases.push_back({"bf16 accumulation", autograd::Precision::BF16, 2, wrapped(false)});
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Cluster c = loopback_cluster(1);
    auto servers = start_servers(c, 2);
    const RunResult r = run_job(
        c, options(Mode::kAsync, 1, tasks_per_epoch(96, 16, 1)), d,
        [&](int w) {
          WorkerOptions o{.worker = w, .batch_size = 16};
          o.precision = k.precision;
          o.accumulation_steps = k.accumulation;
          return o;
        },
        k.model);
    StrategyOptions so;
    so.precision = k.precision;
    so.accumulation_steps = k.accumulation;
    const auto ref = reference(1, d, 1, 16, 0, so, k.model);
    EXPECT_EQ(r.params, ref);
    if (k.precision == autograd::Precision::BF16) {  // recompute and offload change no number
      EXPECT_NE(ref, reference(1, d, 1, 16, 0, {}, [] { return small_model(); }))
          << "the step ran in f32";
    }
  }
}

TEST(PsTraining, SyncModeMatchesMirrored) {
  for (int workers : {2, 3}) {
    const auto d = small_data(144);
    Cluster c = loopback_cluster(workers);
    auto servers = start_servers(c, 2);
    const RunResult r = run_job(c, options(Mode::kSync, 2, tasks_per_epoch(144, 8, workers)), d,
                                [](int w) { return WorkerOptions{.worker = w, .batch_size = 8}; });
    const auto ref = reference(workers, d, 2, 8, 0);
    ASSERT_EQ(r.params.size(), ref.size());
    double worst = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      const double rel = std::abs(r.params[i] - ref[i]) / std::max(1e-3, std::abs(double(ref[i])));
      worst = std::max(worst, rel);
    }
    EXPECT_LT(worst, 1e-5) << workers << " workers";
    std::int64_t steps = 0;
    for (const auto& w : r.workers) {
      steps += w.steps;
      EXPECT_EQ(w.staleness_histogram.size(), 17u);
    }
    EXPECT_EQ(steps, 2 * tasks_per_epoch(144, 8, workers));
  }
}

// The seeds' models through parameter servers: synchronous PS training of a GPT (language
// modelling) and a ResNet (BatchNorm on each worker's rows, as on each Mirrored replica's) over 2
// workers equals Mirrored with 2 replicas.
TEST(PsTraining, SyncModeMatchesMirroredForGptAndResNet) {
  struct ModelCase {
    const char* name;
    std::function<std::shared_ptr<nn::Module>()> model;
    data::LabelledData data;
    std::shared_ptr<const nn::Objective> objective;
  };
  const auto as_data = [](const nn::Batch& b) { return data::LabelledData{b.inputs, b.targets}; };
  const ModelCase cases[] = {
      {"gpt",
       [] {
         manual_seed(5);
         return hpm::testing::tiny_gpt();
       },
       as_data(hpm::testing::token_batch(48, 8, 32, 3)), std::make_shared<nn::LanguageModelling>()},
      {"resnet",
       [] {
         manual_seed(5);
         return hpm::testing::tiny_resnet();
       },
       as_data(hpm::testing::image_batch(48, 3)), std::make_shared<nn::Classification>()},
  };
  for (const ModelCase& mc : cases) {
    SCOPED_TRACE(mc.name);
    Cluster c = loopback_cluster(2);
    auto servers = start_servers(c, 2);
    const RunResult r = run_job(
        c, options(Mode::kSync, 1, tasks_per_epoch(48, 4, 2)), mc.data,
        [&](int w) {
          return WorkerOptions{.worker = w, .batch_size = 4, .objective = mc.objective};
        },
        mc.model);
    // Mirrored x2 over the same global batches: the epoch's order, 8 rows a step.
    StrategyOptions so;
    so.replicas = 2;
    auto mirrored = make_mirrored(so);
    mirrored->scope(mc.model, [](nn::Module& m) {
      return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.1f, 0.9f});
    });
    const auto order = epoch_order(48, 0, 0);
    for (std::int64_t s = 0; s < 48 / 8; ++s) {
      const std::vector<std::int64_t> rows(order.begin() + s * 8, order.begin() + (s + 1) * 8);
      mirrored->train_step({kernels::index_select0(mc.data.inputs, rows),
                            kernels::index_select0(mc.data.labels, rows)},
                           *mc.objective, 0.0f);
    }
    // Float reassociation alone (the servers sum the parts' gradients in another order than the
    // all-reduce), over 6 steps with momentum: about 1e-5 (1.2e-5 for the ResNet).
    hpm::testing::expect_same_parameters(flat(mirrored->model()->named_parameters()), r.params,
                                         mc.name, 3e-5f);
    // Running statistics: each step the servers average what the parts' forwards made of the same
    // pulled values, which is the mean of Mirrored's replicas' own (the update is linear).
    std::vector<std::vector<float>> per_replica(2);
    mirrored->run([&](ReplicaContext& ctx) {
      per_replica[static_cast<std::size_t>(ctx.replica_id_in_sync)] = flat_buffers(ctx.model);
    });
    std::vector<float> mean(per_replica[0].size());
    for (std::size_t i = 0; i < mean.size(); ++i)
      mean[i] = 0.5f * (per_replica[0][i] + per_replica[1][i]);
    ASSERT_EQ(r.buffers.size(), mean.size());
    EXPECT_EQ(r.buffers.empty(), std::string(mc.name) == "gpt");
    hpm::testing::expect_same_parameters(mean, r.buffers, std::string(mc.name) + " buffers", 1e-4f);
    if (!r.buffers.empty()) {
      EXPECT_NE(r.buffers, flat_buffers(*mc.model())) << "never moved";
    }
  }
}

// BatchNorm's running statistics live on the servers beside the parameters: one asynchronous
// worker trains a ResNet as one device does, running statistics included, and the chief's model
// (what it evaluates, in eval mode) holds them rather than their initial values.
TEST(PsTraining, OneAsyncWorkerKeepsTheResNetsRunningStatistics) {
  const auto model = [] {
    manual_seed(5);
    return hpm::testing::tiny_resnet();
  };
  const nn::Batch b = hpm::testing::image_batch(48, 3);
  const data::LabelledData d{b.inputs, b.targets};
  const auto objective = std::make_shared<nn::Classification>();
  Cluster c = loopback_cluster(1);
  auto servers = start_servers(c, 2);
  const RunResult r = run_job(
      c, options(Mode::kAsync, 1, tasks_per_epoch(48, 8, 1)), d,
      [&](int w) { return WorkerOptions{.worker = w, .batch_size = 8, .objective = objective}; },
      model);
  auto one = make_one_device();
  one->scope(model, [](nn::Module& m) {
    return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.1f, 0.9f});
  });
  const auto order = epoch_order(48, 0, 0);
  for (std::int64_t s = 0; s < 48 / 8; ++s) {
    const std::vector<std::int64_t> rows(order.begin() + s * 8, order.begin() + (s + 1) * 8);
    one->train_step(
        {kernels::index_select0(d.inputs, rows), kernels::index_select0(d.labels, rows)},
        *objective, 0.0f);
  }
  // Float reassociation (the servers apply SGD to each shard apart): the strategies' 1e-4.
  hpm::testing::expect_same_parameters(flat(one->model()->named_parameters()), r.params,
                                       "parameters", 1e-4f);
  const std::vector<float> want = flat_buffers(*one->model());
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(r.buffers.size(), want.size());
  EXPECT_NE(r.buffers, flat_buffers(*model())) << "the servers' running statistics never moved";
  hpm::testing::expect_same_parameters(want, r.buffers, "running statistics", 1e-4f);
}

// Each epoch's evaluation sees the variables as that epoch left them: the next epoch's tasks wait
// for it, so however long it takes, the servers have applied exactly the epoch's updates.
TEST(PsTraining, EpochEvaluationSeesTheEpochsEnd) {
  const auto d = small_data(640);
  Cluster c = loopback_cluster(2);
  auto servers = start_servers(c, 2);
  const std::int64_t per_epoch = tasks_per_epoch(640, 8, 1);
  CoordinatorOptions co = options(Mode::kAsync, 2, per_epoch);
  std::vector<std::int64_t> epochs_seen;
  co.on_epoch = [&](EpochReport& e) {
    epochs_seen.push_back(e.epoch);
    std::this_thread::sleep_for(100ms);  // workers not held back would run on meanwhile
    PsClient probe(c, {"probe"}, {1});
    for (const ShardStatus& s : probe.status(std::chrono::milliseconds(2000))) {
      ASSERT_TRUE(s.reachable) << s.error;
      EXPECT_EQ(s.version, (e.epoch + 1) * per_epoch) << "updates applied at epoch " << e.epoch + 1;
    }
  };
  const RunResult r =
      run_job(c, co, d, [](int w) { return WorkerOptions{.worker = w, .batch_size = 8}; });
  EXPECT_EQ(epochs_seen, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(r.report.tasks, 2 * per_epoch);
}

TEST(PsTraining, SspKeepsTheFastestWorkerWithinTheBound) {
  const auto d = small_data(640);
  for (Mode mode : {Mode::kSsp, Mode::kAsync}) {
    Cluster c = loopback_cluster(2);
    auto servers = start_servers(c, 1);
    CoordinatorOptions co = options(mode, 1, tasks_per_epoch(640, 8, 1));
    co.staleness = 2;
    // Worker 1 sleeps so that its steps take ~10 ms more: worker 0 would run far ahead.
    const RunResult r = run_job(c, co, d, [](int w) {
      return WorkerOptions{.worker = w, .batch_size = 8, .slow_factor = w == 1 ? 60.0 : 1.0};
    });
    const auto fast = r.workers[0].steps, slow = r.workers[1].steps;
    EXPECT_EQ(fast + slow, 80);
    if (mode == Mode::kSsp) {
      EXPECT_LE(fast - slow, co.staleness + 1) << "fast " << fast << ", slow " << slow;
    } else {
      EXPECT_GT(fast - slow, 10) << "async: the fast worker should not wait (fast " << fast
                                 << ", slow " << slow << ")";
    }
  }
}

TEST(PsTraining, LostParameterServerIsRestoredFromTheLastCheckpoint) {
  hpm::testing::TempDir dir;
  const auto d = small_data(800);
  Cluster c = loopback_cluster(2);
  auto servers = start_servers(c, 2);
  CoordinatorOptions co = options(Mode::kAsync, 2, tasks_per_epoch(800, 8, 1));
  co.checkpoint_dir = dir.path();
  co.checkpoint_every_tasks = 20;
  co.ps_wait = 20s;
  std::vector<std::string> lines;
  std::mutex mu;
  co.log = [&](const std::string& l) {
    std::lock_guard lock(mu);
    lines.push_back(l);
  };
  std::vector<std::int64_t> epochs_seen;
  co.on_epoch = [&](EpochReport& e) { epochs_seen.push_back(e.epoch); };
  // Kill task 1 once some checkpoint exists, and bring an empty one back on the same port.
  std::thread killer([&] {
    while (!std::filesystem::exists(dir / "latest")) std::this_thread::sleep_for(5ms);
    std::this_thread::sleep_for(30ms);
    servers[1].reset();
    std::this_thread::sleep_for(300ms);
    servers[1] = std::make_unique<ParameterServer>(c, 1, c.ps[1]);
  });
  RunResult r;
  try {
    r = run_job(c, co, d, [](int w) {
      return WorkerOptions{.worker = w, .batch_size = 8, .slow_factor = 3.0};
    });
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  killer.join();
  EXPECT_EQ(r.report.ps_restores, 1);
  EXPECT_GE(r.report.checkpoints, 2);
  EXPECT_EQ(epochs_seen, (std::vector<std::int64_t>{0, 1}));
  bool lost = false, restored = false;
  for (const auto& l : lines) {
    lost = lost || l.find("parameter server lost: task 1") != std::string::npos;
    restored = restored ||
               (l.find("restored all 2 shards from " + dir.path() + "/ckpt-") != std::string::npos);
  }
  EXPECT_TRUE(lost);
  EXPECT_TRUE(restored);
  for (float v : r.params) ASSERT_TRUE(std::isfinite(v));
}

TEST(PsTraining, ACheckpointIsWhereTheNextJobStarts) {
  hpm::testing::TempDir dir;
  const auto d = small_data(96);
  Cluster c = loopback_cluster(1);
  auto servers = start_servers(c, 2);
  CoordinatorOptions co = options(Mode::kAsync, 1, tasks_per_epoch(96, 16, 1));
  // Spelled with a trailing "/": pruning compared the listing's paths with its own spelling
  // ("dir//ckpt-..."), so it deleted the checkpoint just written and the one before.
  co.checkpoint_dir = dir.path() + "/";
  std::filesystem::create_directories(dir / "ckpt-0000000003.bak");  // a copy of the user's
  io::write_file_atomic(dir / "ckpt-0000000003.bak/manifest.json", "{}");
  auto worker = [](int w) { return WorkerOptions{.worker = w, .batch_size = 16}; };
  run_job(c, co, d, worker);  // epoch 1, checkpointed at its end
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt-0000000006/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt-0000000003.bak/manifest.json"));
  co.epochs = 2;  // the same job, asked for one more epoch
  servers = start_servers(c, 2);
  const RunResult r = run_job(c, co, d, worker);
  EXPECT_NE(r.report.restored_from.find("ckpt-0000000006"), std::string::npos);
  EXPECT_EQ(r.workers[0].steps, 6);  // only the second epoch ran
  // Two epochs straight through give the same parameters (the optimizer state was restored).
  const auto ref = reference(1, d, 2, 16, 0);
  for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(r.params[i], ref[i]) << "parameter " << i;
}

// A job continues a checkpoint only if it counts steps as the writer did: its shards' versions
// are the writer's steps, and a sync job continued with other parts per step (workers) or another
// mode took the next epoch's pushes for duplicates and dropped them, reporting success.
TEST(PsTraining, AJobCountingStepsOtherwiseIsRefusedItsCheckpoint) {
  hpm::testing::TempDir dir;
  const auto d = small_data(96);
  Cluster c = loopback_cluster(2);
  auto servers = start_servers(c, 2);
  CoordinatorOptions co = options(Mode::kSync, 1, tasks_per_epoch(96, 16, 2));
  co.checkpoint_dir = dir.path();
  run_job(c, co, d, [](int w) { return WorkerOptions{.worker = w, .batch_size = 16}; });
  struct Case {
    Mode mode;
    int workers;
    std::int64_t tasks;
    const char* named;
  };
  for (const Case& k :
       {Case{Mode::kAsync, 2, tasks_per_epoch(96, 16, 2), "with mode sync"},
        Case{Mode::kSync, 3, tasks_per_epoch(96, 16, 2), "with steps of 2 parts"},
        Case{Mode::kSync, 2, tasks_per_epoch(96, 8, 2), "with epochs of 6 tasks"}}) {
    Cluster other = loopback_cluster(k.workers);
    servers = start_servers(other, 2);
    CoordinatorOptions again = options(k.mode, 2, k.tasks);
    again.checkpoint_dir = dir.path();
    Coordinator coordinator(other, again, ps_variables(*small_model()), "127.0.0.1:0");
    try {
      coordinator.run();
      ADD_FAILURE() << k.named << ": continued";
    } catch (const PsError& e) {
      EXPECT_NE(std::string(e.what()).find(k.named), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace hpm::distribute::ps
