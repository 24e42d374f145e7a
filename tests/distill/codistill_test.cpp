// Codistillation: the exchange delivers each peer's parameters at the right steps (stale by at
// most N), no distillation term before the burn-in (bit-identical to independent training), a
// peer that dies fails the exchange naming its rank, and `hpm codistill` end to end (threads, and
// processes under `hpm launch`).
#include "hpm/distill/codistill.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "common/blobs.h"
#include "common/hpm_cli.h"
#include "hpm/comm/local.h"
#include "hpm/distill/distiller.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

using distill::Codistiller;
using distill::CodistillOptions;

std::shared_ptr<nn::Module> mlp() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 3)});
}

std::shared_ptr<optim::Optimizer> sgd(nn::Module& m) {
  return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.05f, 0.9f});
}

// Calls `fn` from a callback at the end of every batch.
class OnBatch : public train::Callback {
 public:
  explicit OnBatch(std::function<void(const train::BatchLogs&)> fn) : fn_(std::move(fn)) {}
  void on_batch_end(train::Trainer&, const train::BatchLogs& b) override { fn_(b); }

 private:
  std::function<void(const train::BatchLogs&)> fn_;
};

// One copy per thread over a local group; `body(rank, comm)` trains copy `rank`.
void run_copies(int k, const std::function<void(int, comm::CommunicatorPtr)>& body) {
  auto group = comm::make_local_group(k, std::chrono::seconds(20));
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r, c = std::move(group[r])]() mutable {
      Generator gen(100 + static_cast<std::uint64_t>(r));
      ThreadGeneratorGuard guard(gen);
      body(r, std::move(c));
    });
  }
  for (auto& t : threads) t.join();
}

train::FitOptions fit_options(std::uint64_t seed) {
  train::FitOptions o;
  o.epochs = 2;
  o.batch_size = 32;
  o.seed = seed;
  return o;
}

// Each copy's final parameters after training with `options` on identical data, copy r from
// seed 10 + r (initialization and data order).
std::vector<std::vector<std::vector<float>>> train_pair(const CodistillOptions& options) {
  const auto data = testing::blobs(256, 1);  // 8 steps per epoch
  std::vector<std::vector<std::vector<float>>> out(2);
  run_copies(2, [&](int r, comm::CommunicatorPtr comm) {
    manual_seed(10 + static_cast<std::uint64_t>(r));  // the thread's generator
    auto model = mlp();
    train::Trainer trainer(model, sgd(*model));
    distill::attach(trainer, std::make_shared<Codistiller>(std::move(comm), model, mlp, options));
    trainer.fit(data, nullptr, fit_options(20 + static_cast<std::uint64_t>(r)));
    for (const auto& p : model->parameters()) out[r].push_back(p.to_vector());
  });
  return out;
}

// Three copies' logits scored on the same rows: each copy's accuracy and cross-entropy, and the
// churn of each pair, as distill::churn finds it.
TEST(Codistill, CopiesAreScoredEachAndInPairs) {
  const Tensor y = Tensor::from_i64(std::vector<std::int64_t>{0, 1, 1, 0}, {4});
  const std::vector<Tensor> logits = {
      Tensor::from({3, 0, 0, 3, 0, 3, 3, 0}, {4, 2}),   // all right
      Tensor::from({3, 0, 3, 0, 0, 3, 3, 0}, {4, 2}),   // row 1 wrong
      Tensor::from({0, 3, 3, 0, 3, 0, 0, 3}, {4, 2})};  // all wrong
  const distill::CopiesScore s = distill::score_copies(logits, y);
  ASSERT_EQ(s.accuracy.size(), 3u);
  EXPECT_DOUBLE_EQ(s.accuracy[0], 1.0);
  EXPECT_DOUBLE_EQ(s.accuracy[1], 0.75);
  EXPECT_DOUBLE_EQ(s.accuracy[2], 0.0);
  for (std::size_t r = 0; r < 3; ++r)
    EXPECT_NEAR(s.loss[r], cross_entropy(logits[r], y).item(), 1e-6) << r;
  ASSERT_EQ(s.pairs.size(), 3u);
  EXPECT_EQ(s.pairs[1].a, 0);
  EXPECT_EQ(s.pairs[1].b, 2);
  EXPECT_DOUBLE_EQ(s.pairs[0].churn.churn, 0.25);  // copies 0 and 1 differ on row 1
  EXPECT_DOUBLE_EQ(s.pairs[1].churn.churn, 1.0);
  EXPECT_DOUBLE_EQ(s.pairs[2].churn.churn, 0.75);
  EXPECT_DOUBLE_EQ(s.mean_accuracy(), 1.75 / 3);
  EXPECT_DOUBLE_EQ(s.mean_churn(), 2.0 / 3);
}

TEST(Codistill, ExchangeDeliversPeersParametersEveryNStepsAtMostNStale) {
  const auto data = testing::blobs(256, 1);
  constexpr std::int64_t kN = 3;
  // own[r][step] = copy r's flattened parameters after `step` steps; seen[r][step] = what copy r
  // holds of its peer right after the exchange at `step`.
  std::vector<std::map<std::int64_t, std::vector<float>>> own(2), seen(2);
  std::vector<std::int64_t> exchanges(2);
  run_copies(2, [&](int r, comm::CommunicatorPtr comm) {
    manual_seed(10 + static_cast<std::uint64_t>(r));
    auto model = mlp();
    own[r][0] = distill::flatten_state(*model).to_vector();
    train::Trainer trainer(model, sgd(*model));
    // Before the exchange callback: the copy's own parameters after each step.
    trainer.add_callback(std::make_shared<OnBatch>([&, r, model](const train::BatchLogs& b) {
      own[r][b.global_step] = distill::flatten_state(*model).to_vector();
    }));
    auto c = std::make_shared<Codistiller>(std::move(comm), model, mlp,
                                           CodistillOptions{kN, 4, 0.5f, 2.0f});
    distill::attach(trainer, c);
    EXPECT_EQ(c->last_exchange_step(), -1);
    // After it: what the peer copy holds, and how stale it is.
    trainer.add_callback(std::make_shared<OnBatch>([&, r, c](const train::BatchLogs& b) {
      EXPECT_EQ(c->last_exchange_step() % kN, 0);
      EXPECT_GE(c->last_exchange_step(), b.global_step - kN + 1);
      EXPECT_LE(c->last_exchange_step(), b.global_step);
      if (c->last_exchange_step() == b.global_step) {
        seen[r][b.global_step] = distill::flatten_state(*c->peers()[0]).to_vector();
      }
    }));
    trainer.fit(data, nullptr, fit_options(20 + static_cast<std::uint64_t>(r)));
    exchanges[r] = c->exchanges();
  });
  // 16 steps: exchanges before step 1 and after steps 3, 6, 9, 12, 15.
  EXPECT_EQ(exchanges[0], 6);
  EXPECT_EQ(exchanges[1], 6);
  ASSERT_EQ(seen[0].size(), 5u);
  for (int r = 0; r < 2; ++r) {
    for (const auto& [step, values] : seen[r]) {
      EXPECT_EQ(values, own[1 - r].at(step)) << "copy " << r << " step " << step;
    }
  }
  // The copies started apart and the exchange did not touch their own parameters.
  EXPECT_NE(own[0].at(15), own[1].at(15));
}

TEST(Codistill, BeforeBurnInItIsIndependentTrainingBitForBit) {
  // 16 steps in all. Burn-in past the end: bit-identical to alpha 0 (no exchange at all).
  const auto independent = train_pair({4, 0, 0.0f, 2.0f});
  EXPECT_EQ(train_pair({4, 16, 0.5f, 2.0f}), independent);
  // A burn-in of 4 steps: the distillation term changes the trajectories.
  const auto codistilled = train_pair({4, 4, 0.5f, 2.0f});
  EXPECT_NE(codistilled[0], independent[0]);
  EXPECT_NE(codistilled[1], independent[1]);
}

TEST(Codistill, PeerThatDiesFailsTheExchangeNamingItsRank) {
  std::string error;
  run_copies(2, [&](int r, comm::CommunicatorPtr comm) {
    auto model = mlp();
    Codistiller c(std::move(comm), model, mlp, CodistillOptions{1, 0, 0.5f, 1.0f});
    if (r == 1) return;  // dies: its communicator is destroyed with the Codistiller
    try {
      c.exchange(0);
    } catch (const comm::CommError& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
}

TEST(Codistill, RejectsBadOptions) {
  auto group = comm::make_local_group(1);
  EXPECT_THROW(Codistiller(group[0], mlp(), mlp, CodistillOptions{0, 0, 0.5f, 1.0f}),
               std::invalid_argument);
  EXPECT_THROW(Codistiller(group[0], mlp(), mlp, CodistillOptions{1, -1, 0.5f, 1.0f}),
               std::invalid_argument);
  EXPECT_THROW(Codistiller(group[0], mlp(), mlp, CodistillOptions{1, 0, 1.5f, 1.0f}),
               std::invalid_argument);
  EXPECT_THROW(distill::load_flat_state(*mlp(), Tensor::zeros({5})), std::invalid_argument);
}

// ---- hpm codistill ------------------------------------------------------------------------------

TEST(CodistillCommand, ThreadsAndProcessesReportAccuracyAndChurn) {
  testing::TempDir dir;
  testing::write_synthetic_mnist(dir.path(), 320, 100);
  const std::string cfg = testing::small_mlp_config(
      dir, dir.path(),
      "[codistill]\ncopies = 2\nexchange_every = 5\nburn_in = 10\nalpha = 0.5\n"
      "shards = \"disjoint\"\n");
  const std::string report = dir / "co.json";
  auto r = testing::run_hpm("codistill " + cfg + " --report " + report);
  ASSERT_EQ(r.code, 0) << r.output;
  auto j = nlohmann::json::parse(testing::read_text(report));
  EXPECT_EQ(j["copies"], 2);
  EXPECT_EQ(j["steps"], 20);     // 160 rows per shard, batch 16, 2 epochs
  EXPECT_EQ(j["exchanges"], 5);  // before step 1, after 5, 10, 15, 20
  ASSERT_EQ(j["copy_test_accuracies"].size(), 2u);
  EXPECT_GT(j["copy_test_accuracies"][1].get<double>(), 0.5);
  ASSERT_EQ(j["pairwise_churn"].size(), 1u);
  EXPECT_GE(j["mean_churn"].get<double>(), 0.0);
  EXPECT_LE(j["mean_churn"].get<double>(), 1.0);

  // The same through processes and gloo: the same numbers (same seeds, same arithmetic).
  const std::string report2 = dir / "co2.json";
  r = testing::run_shell(testing::hpm_binary() + " launch -n 2 -- " + testing::hpm_binary() +
                         " codistill " + cfg + " --report " + report2);
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j2 = nlohmann::json::parse(testing::read_text(report2));
  EXPECT_EQ(j2["copy_test_accuracies"], j["copy_test_accuracies"]);
  EXPECT_EQ(j2["mean_churn"], j["mean_churn"]);
  EXPECT_EQ(j2["exchanges"], 5);

  // More processes than copies is an error.
  r = testing::run_shell(testing::hpm_binary() + " launch -n 2 -- " + testing::hpm_binary() +
                         " codistill " + cfg + " --set codistill.copies=3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("copies = 3"), std::string::npos) << r.output;
}

// Settings hpm codistill cannot honour are refused before any work, naming where they were given.
TEST(CodistillCommand, SettingsItCannotHonourAreRefusedWithTheirPlace) {
  testing::TempDir dir;
  const std::string cfg = testing::small_mlp_config(
      dir, dir.path(), "[codistill]\ncopies = 2\n[pipeline]\nstages = 2\n");
  auto r = testing::run_hpm("codistill " + cfg);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(cfg + ":14:1: [pipeline] does not apply to hpm codistill"),
            std::string::npos)
      << r.output;
  const std::string plain = testing::small_mlp_config(dir, dir.path(), "[codistill]\ncopies = 2\n");
  r = testing::run_hpm("codistill " + plain + " --set train.backup_dir=" + dir / "b");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("--set train.backup_dir=" + dir / "b" +
                          ": [train] backup_dir is not supported by hpm codistill"),
            std::string::npos)
      << r.output;
  for (const auto& [set, expect] : std::vector<std::pair<std::string, std::string>>{
           {"memory.recompute=always", "[memory] recompute is not applied by hpm codistill yet"},
           {"memory.device_budget_mb=64",
            "[memory] device_budget_mb is not applied by hpm codistill"},
           {"early_stopping.patience=1", "[early_stopping] is not applied by hpm codistill"}}) {
    r = testing::run_hpm("codistill " + plain + " --set " + set);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find(expect), std::string::npos) << r.output;
  }
}

// A byte-level GPT on three small text files: copies trained by `hpm codistill` with alpha 0 are
// exactly `hpm train` runs of their seeds; with a burn-in as long as training, exchanging changes
// nothing; after a burn-in the distillation term changes the copies; each copy writes its metrics
// CSV, and the report holds every copy's validation loss and the churn of next-token predictions.
TEST(CodistillCommand, LanguageModelCopiesAreIndependentRunsUntilTheBurnInEnds) {
  testing::TempDir dir;
  testing::write_word_files(dir);
  const std::string cfg = dir / "gpt.toml";
  std::ofstream(cfg) << "[model]\nkind = \"gpt\"\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
                        "block_size = 16\nvocab_size = 256\ndropout = 0.0\n"
                        "[data]\nsource = \"text\"\nfiles = \""
                     << dir.path()
                     << "/*.txt\"\nbatch_size = 4\n"
                        "[optimizer]\nkind = \"adamw\"\nlr = 3e-3\n"
                        "[train]\nmax_steps = 20\neval_every = 10\neval_iters = 4\nseed = 3\n"
                        "metrics_csv = \""
                     << dir / "m.csv"
                     << "\"\n[codistill]\ncopies = 2\nexchange_every = 5\nburn_in = 10\n"
                        "alpha = 0.5\ntemperature = 2.0\nshards = \"identical\"\n";
  const auto codistill = [&](const std::string& sets, const std::string& name) {
    const auto r = testing::run_hpm("codistill " + cfg + sets + " --report " + dir / name);
    EXPECT_EQ(r.code, 0) << r.output;
    return nlohmann::json::parse(testing::read_text(dir / name));
  };
  const auto independent = codistill(" --set codistill.alpha=0", "alpha0.json");
  for (int copy = 0; copy < 2; ++copy) {
    const auto r = testing::run_hpm("train " + cfg + " --seed " + std::to_string(3 + copy) +
                                    " --report " + dir / "train.json");
    ASSERT_EQ(r.code, 0) << r.output;
    const double alone = testing::report_number(dir / "train.json", "test_loss");
    EXPECT_NEAR(independent["copy_test_losses"][copy].get<double>(), alone, 1e-5) << copy;
  }
  EXPECT_EQ(independent["exchanges"], 0);

  const auto long_burn_in = codistill(" --set codistill.burn_in=20", "burn20.json");
  EXPECT_EQ(long_burn_in["exchanges"], 5);  // before step 1, after 5, 10, 15, 20
  EXPECT_EQ(long_burn_in["copy_test_losses"], independent["copy_test_losses"]);
  EXPECT_EQ(long_burn_in["mean_churn"], independent["mean_churn"]);

  const auto distilled = codistill(" --set train.tensorboard_dir=" + dir / "tb", "co.json");
  EXPECT_EQ(distilled["steps"], 20);
  for (const char* run : {"copy-0/train", "copy-0/validation", "copy-1/train", "copy-1/validation"})
    EXPECT_TRUE(std::filesystem::is_directory(dir / ("tb/" + std::string(run)))) << run;
  for (int copy = 0; copy < 2; ++copy) {
    const double loss = distilled["copy_test_losses"][copy].get<double>();
    EXPECT_TRUE(loss > 0.5 && loss < std::log(256.0)) << loss;
    EXPECT_NE(loss, independent["copy_test_losses"][copy].get<double>());
    // Two evaluations per copy (every 10 of 20 steps), each with a validation loss.
    std::ifstream csv(dir / ("m-copy-" + std::to_string(copy) + ".csv"));
    std::string header, row;
    std::getline(csv, header);
    int rows = 0;
    while (std::getline(csv, row)) {
      ++rows;
      // epoch, train_loss, train_accuracy (empty: a language model has none per row),
      // test_loss, test_accuracy, ...
      std::vector<std::string> cells;
      std::stringstream cols(row);
      for (std::string cell; std::getline(cols, cell, ',');) cells.push_back(cell);
      ASSERT_GE(cells.size(), 5u) << row;
      EXPECT_TRUE(cells[2].empty()) << row;
      EXPECT_FALSE(cells[3].empty()) << row;
      EXPECT_FALSE(cells[4].empty()) << row;
    }
    EXPECT_EQ(rows, 2);
  }
  const double churn = distilled["mean_churn"].get<double>();
  EXPECT_GE(churn, 0.0);  // after 20 steps on this text the copies may well agree everywhere
  EXPECT_LE(churn, 1.0);

  // Disjoint halves of the training tokens: other data, other copies.
  const auto halves = codistill(" --set codistill.shards='\"disjoint\"'", "halves.json");
  EXPECT_NE(halves["copy_test_losses"], distilled["copy_test_losses"]);
}

}  // namespace
}  // namespace hpm
