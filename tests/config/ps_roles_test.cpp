// A configuration's parameter-server job run through the library's role calls (ps_roles.h), every
// role on a thread of this test: one parameter-server task, the coordinator and a worker train a
// small mlp to its end; the report holds every epoch and worker. `hpm ps` (tests/cli) keeps the
// processes, the kills and the flags.
#include "hpm/config/ps_roles.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/hpm_cli.h"
#include "common/temp_dir.h"

namespace hpm::config {
namespace {

using hpm::testing::TempDir;

// Ports from the test's pid (apart from tests/cli's), so parallel ctest runs do not collide.
std::string address(int k) {
  return "\"127.0.0.1:" + std::to_string(42000 + (::getpid() % 1500) * 10 + k) + "\"";
}

std::string ps_config(const TempDir& dir) {
  const std::string path = dir / "ps.toml";
  std::ofstream(dir / "token") << "ps-roles-test\n";
  std::ofstream(path)
      << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = 784, out = 32 }, "
         "{ type = \"relu\" }, { type = \"linear\", in = 32, out = 10 }]\n"
      << "[data]\ndir = \"" << dir.path() << "\"\nbatch_size = 16\n"
      << "[optimizer]\nkind = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
      << "[train]\nepochs = 2\n"
      << "[cluster]\ncoordinator = " << address(0) << "\nps = [" << address(1)
      << "]\nworkers = 1\nrpc_timeout_s = 5\ntoken_file = \"" << dir / "token"
      << "\"\n"
      << "[ps]\nheartbeat_timeout_s = 5\nps_wait_s = 20\nmode = \"async\"\n";
  return path;
}

TEST(PsRoles, AJobOnThreadsTrainsToItsEndAndReportsEveryEpochAndWorker) {
  TempDir dir;
  hpm::testing::write_synthetic_mnist(dir.path(), 480, 100);
  const Config cfg = load_config(ps_config(dir));
  check_ps_settings(cfg);
  std::vector<std::string> lines;
  std::mutex mu;
  const RunLog log = [&](const std::string& l) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(l);
  };
  distribute::ps::ServerCounters served;
  distribute::ps::WorkerReport worked;
  std::exception_ptr server_error, worker_error;
  std::thread server([&] {
    try {
      served = run_ps_server(cfg, 0, log);
    } catch (...) {
      server_error = std::current_exception();
    }
  });
  std::thread worker([&] {
    try {
      worked = run_ps_worker(cfg, 0);
    } catch (...) {
      worker_error = std::current_exception();
    }
  });
  distribute::ps::CoordinatorReport r;
  EXPECT_NO_THROW(r = run_ps_coordinator(cfg, log));
  worker.join();
  server.join();
  if (server_error) std::rethrow_exception(server_error);
  if (worker_error) std::rethrow_exception(worker_error);
  EXPECT_EQ(r.tasks, 60) << "480 rows / 16 per task, 2 epochs";
  EXPECT_EQ(worked.steps, 60);
  EXPECT_EQ(served.pushes, 60);
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_GT(r.epochs[1].test_accuracy, 0.5);
  const nlohmann::json j = ps_job_report(cfg, r);
  EXPECT_EQ(j["tasks"], 60);
  EXPECT_EQ(j["epochs"].size(), 2u);
  EXPECT_EQ(j["per_worker"].size(), 1u);
  EXPECT_EQ(j["epochs"][1]["test_accuracy"], r.epochs[1].test_accuracy);
  bool epoch_told = false, listening_told = false;
  for (const auto& l : lines) {
    epoch_told = epoch_told || l.rfind("epoch 2/2: ", 0) == 0;
    listening_told = listening_told || l.find("listening on") != std::string::npos;
  }
  EXPECT_TRUE(epoch_told);
  EXPECT_TRUE(listening_told);
}

// Each was ignored without a word: the workers trained on raw rows while the coordinator's
// evaluation applied the augmentation, a step schedule ran per epoch (a warmup of 500 steps as
// 500 epochs), max_steps ran whole epochs, biases were decayed.
TEST(PsRoles, SettingsAJobCannotHonourAreRefused) {
  TempDir dir;
  for (const std::string set :
       {"train.clip_grad_norm=1.0", "data.augment=[{ op = \"random_flip\" }]", "data.shuffle=false",
        "data.shuffle_buffer=100", "data.drop_remainder=false", "schedule.unit=\"step\"",
        "optimizer.weight_decay_min_rank=2"}) {
    const Config cfg = load_config(ps_config(dir), {set});
    try {
      check_ps_settings(cfg);
      ADD_FAILURE() << set << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--set " + set + ": "), std::string::npos) << e.what();
    }
  }
  const Config by_steps = load_config(ps_config(dir), {"train.max_steps=10"});
  EXPECT_THROW(check_ps_settings(by_steps), ConfigError);
  EXPECT_NO_THROW(check_ps_settings(load_config(ps_config(dir))));
}

}  // namespace
}  // namespace hpm::config
