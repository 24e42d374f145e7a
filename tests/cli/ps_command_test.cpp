// `hpm ps` as processes: a worker SIGKILLed mid-run has its in-flight tasks rescheduled and
// rejoins when restarted; a SIGKILLed parameter server makes the coordinator restore every shard
// from the last checkpoint and finish; `hpm launch --ps --workers` runs a whole job; tokens and
// config mistakes get clear errors.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <vector>

#include "common/hpm_cli.h"

namespace hpm::testing {
namespace {

struct PsJob {
  TempDir dir;
  std::string config;

  // A small mlp on synthetic data: `epochs` epochs of 1600 / 16 = 100 tasks each.
  explicit PsJob(int ps_tasks, int workers, int epochs, const std::string& ps_extra = "") {
    write_synthetic_mnist(dir.path(), 1600, 200);
    config = dir / "ps.toml";
    std::string ps = "[";
    for (int t = 0; t < ps_tasks; ++t) ps += (t ? ", " : "") + address(1 + t);
    std::ofstream(config)
        << "[model]\nlayers = [{ type = \"flatten\" }, { type = \"linear\", in = 784, out = 32 }, "
           "{ type = \"relu\" }, { type = \"linear\", in = 32, out = 10 }]\n"
        << "[data]\ndir = \"" << dir.path() << "\"\nbatch_size = 16\n"
        << "[optimizer]\nkind = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
        << "[train]\nepochs = " << epochs << "\n"
        << "[cluster]\ncoordinator = " << address(0) << "\nps = " << ps
        << "]\nworkers = " << workers << "\nrpc_timeout_s = 5\n"
        << "[ps]\nheartbeat_timeout_s = 2\nps_wait_s = 20\n"
        << std::regex_replace(ps_extra, std::regex("\\{DIR\\}"), dir.path());
  }
  // Ports from the test's pid, so parallel ctest runs do not collide.
  static std::string address(int k) {
    return "\"127.0.0.1:" + std::to_string(20000 + (::getpid() % 2000) * 10 + k) + "\"";
  }
  std::string hpm(const std::string& args, const std::string& log) const {
    return hpm_binary() + " " + args + " " + config + " > " + (dir / log) + " 2>&1";
  }
  std::string log(const std::string& name) const { return read_text(dir / name); }
};

// Waits (in the shell) until FILE contains TEXT, at most 60 s.
std::string wait_for(const std::string& file, const std::string& text) {
  return "for i in $(seq 1200); do grep -q '" + text + "' " + file +
         " 2>/dev/null && break; sleep 0.05; done; ";
}

TEST(PsCommand, KilledWorkerIsRescheduledAndRejoins) {
  // Worker 1 is slow, so it holds a task most of the time, but not always: at an epoch's end it
  // may wait for the epoch's evaluation, holding none. It is SIGKILLed three times (after epochs
  // 2, 5 and 8) and started again at once each time; at least one kill lands mid-task. The
  // coordinator notices the silence or the new incarnation, whichever comes first.
  PsJob job(1, 2, 40, "slow_worker = 1\nslow_factor = 20\n");
  std::string script = "export HPM_PS_TOKEN=t0k3n; " + job.hpm("ps serve --task 0", "ps0.log") +
                       " & " + job.hpm("ps coordinator", "co.log") + " & CO=$!; " +
                       job.hpm("ps worker --task 0", "w0.log") + " & " +
                       job.hpm("ps worker --task 1", "w1-0.log") + " & W1=$!; ";
  const int kills = 3;
  for (int k = 1; k <= kills; ++k) {
    script += wait_for(job.dir / "co.log", "epoch " + std::to_string(3 * k - 1) + "/") +
              "kill -9 $W1; " + job.hpm("ps worker --task 1", "w1-" + std::to_string(k) + ".log") +
              " & W1=$!; ";
  }
  script += "wait $CO; echo coordinator=$?; wait";
  const CommandResult r = run_shell(script);
  const std::string co = job.log("co.log");
  EXPECT_NE(r.output.find("coordinator=0"), std::string::npos) << r.output << co;
  const std::regex noticed(
      "worker 1 (silent for [0-9.]+ s: ([0-9]+) in-flight|restarted \\(new "
      "incarnation\\): ([0-9]+) of its) task\\(s\\) rescheduled");
  int notices = 0, held = 0;
  for (auto it = std::sregex_iterator(co.begin(), co.end(), noticed); it != std::sregex_iterator();
       ++it, ++notices) {
    const int n = std::stoi((*it)[2].matched ? (*it)[2] : (*it)[3]);
    EXPECT_LE(n, 1) << co;  // a worker runs one task at a time
    held += n;
  }
  EXPECT_GE(notices, kills) << co;
  EXPECT_GE(held, 1) << co;
  EXPECT_NE(co.find("worker 1 restarted (new incarnation)"), std::string::npos) << co;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(co, m, std::regex("done: 4000 tasks in .* ([0-9]+) rescheduled")))
      << co;
  EXPECT_GE(std::stoi(m[1]), held);  // more only if a loaded machine stalled a worker past 2 s
  EXPECT_NE(co.find("epoch 40/40"), std::string::npos) << co;
  // The last restarted worker trained too.
  const std::string last = job.log("w1-" + std::to_string(kills) + ".log");
  ASSERT_TRUE(std::regex_search(last, m, std::regex("hpm ps worker 1: ([0-9]+) steps"))) << last;
  EXPECT_GT(std::stoi(m[1]), 0) << last;
}

TEST(PsCommand, KilledParameterServerIsRestoredFromCheckpoint) {
  PsJob job(2, 2, 10,
            "checkpoint_every_tasks = 100\nslow_worker = 1\nslow_factor = 5\n"
            "checkpoint_dir = \"{DIR}/ckpt\"\n");
  const std::string script =
      "export HPM_PS_TOKEN=t0k3n; " + job.hpm("ps serve --task 0", "ps0.log") + " & " +
      job.hpm("ps serve --task 1", "ps1.log") + " & PS1=$!; " +
      job.hpm("ps coordinator --report " + (job.dir / "r.json"), "co.log") + " & CO=$!; " +
      job.hpm("ps worker --task 0", "w0.log") + " & " + job.hpm("ps worker --task 1", "w1.log") +
      " & " + wait_for(job.dir / "co.log", "epoch 3/") + "kill -9 $PS1; sleep 0.5; " +
      job.hpm("ps serve --task 1", "ps1b.log") + " & wait $CO; echo coordinator=$?; wait";
  const CommandResult r = run_shell(script);
  const std::string co = job.log("co.log");
  EXPECT_NE(r.output.find("coordinator=0"), std::string::npos) << r.output << co;
  EXPECT_NE(co.find("parameter server lost: task 1"), std::string::npos) << co;
  EXPECT_NE(co.find("restored all 2 shards from " + (job.dir / "ckpt") + "/ckpt-"),
            std::string::npos)
      << co;
  EXPECT_NE(co.find("1 parameter-server restore(s)"), std::string::npos) << co;
  EXPECT_NE(co.find("epoch 10/10"), std::string::npos) << co;
  EXPECT_EQ(report_number(job.dir / "r.json", "ps_restores"), 1);
  EXPECT_GT(report_number(job.dir / "r.json", "checkpoints"), 2);
  // The restarted task served to the end and was told to exit.
  EXPECT_NE(job.log("ps1b.log").find("hpm ps serve: task 1 done"), std::string::npos)
      << job.log("ps1b.log");
}

TEST(PsCommand, LaunchRunsAWholeJobWithAReport) {
  PsJob job(2, 2, 2, "mode = \"sync\"\ncheckpoint_dir = \"{DIR}/ckpt\"\n");
  const CommandResult r = run_hpm("launch --ps 2 --workers 2 -- " + hpm_binary() + " ps run " +
                                  job.config + " --report " + (job.dir / "r.json"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[0] epoch 2/2"), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(read_text(job.dir / "r.json"));
  EXPECT_EQ(j["mode"], "sync");
  EXPECT_EQ(j["tasks"], 200);  // 1600 rows / (16 rows x 2 workers) = 50 steps x 2 parts x 2
  ASSERT_EQ(j["per_worker"].size(), 2u);
  std::int64_t steps = 0;
  for (const auto& w : j["per_worker"]) {
    steps += w["steps"].get<std::int64_t>();
    EXPECT_EQ(w["staleness_histogram"].size(), 17u);
    EXPECT_EQ(w["staleness_histogram"][0], w["steps"]);  // sync: never stale
    EXPECT_GT(w["pull_ms_p50"].get<double>(), 0);
  }
  EXPECT_EQ(steps, 200);
  EXPECT_GT(j["epochs"][1]["test_accuracy"].get<double>(), 0.5);

  // The job's checkpoint (manifest and shards) evaluates and exports like a Trainer's, with
  // nothing else (its manifest records the configuration): the model of the last epoch's end,
  // as the job evaluated it.
  const CommandResult ev =
      run_hpm("evaluate " + job.dir / "ckpt" + " --report " + job.dir / "ev.json");
  ASSERT_EQ(ev.code, 0) << ev.output;
  const auto e = nlohmann::json::parse(read_text(job.dir / "ev.json"));
  EXPECT_NEAR(e["test_loss"].get<double>(), j["epochs"][1]["test_loss"].get<double>(), 1e-5);
  const CommandResult ex =
      run_hpm("export " + job.dir / "ckpt" + " -o " + job.dir / "w.safetensors");
  ASSERT_EQ(ex.code, 0) << ex.output;
  const CommandResult ew =
      run_hpm("evaluate " + job.dir / "w.safetensors" + " --report " + job.dir / "ew.json");
  ASSERT_EQ(ew.code, 0) << ew.output;
  EXPECT_EQ(nlohmann::json::parse(read_text(job.dir / "ew.json"))["test_loss"], e["test_loss"]);
}

TEST(PsCommand, TokensAndConfigMistakesGetClearErrors) {
  PsJob job(1, 1, 1);
  CommandResult r =
      run_shell("unset HPM_PS_TOKEN; " + hpm_binary() + " ps serve " + job.config + " --task 0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("hpm: error: no token for the parameter-server RPCs: set [cluster] "
                          "token_file or the environment variable HPM_PS_TOKEN"),
            std::string::npos)
      << r.output;
  r = run_hpm("ps serve " + job.config + " --task 0 --set cluster.token_file=\"" +
              (job.dir / "nope") + "\"");
  EXPECT_NE(r.output.find("cannot read the token file " + (job.dir / "nope")), std::string::npos)
      << r.output;
  r = run_shell("HPM_PS_TOKEN=x " + hpm_binary() + " ps serve " + job.config + " --task 3");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("--task 3 is not in [0, 1)"), std::string::npos) << r.output;
  // A worker with the wrong token is refused by the coordinator and says so.
  const std::string script = "HPM_PS_TOKEN=right " + job.hpm("ps coordinator", "co.log") +
                             " & CO=$!; sleep 1; HPM_PS_TOKEN=wrong " + hpm_binary() +
                             " ps worker " + job.config + " --task 0; echo worker=$?; kill $CO";
  r = run_shell(script);
  EXPECT_NE(r.output.find("UNAUTHENTICATED: wrong token"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("worker=1"), std::string::npos) << r.output;
  // Config typos name the file, line and key.
  std::ofstream(job.config, std::ios::app) << "mdoe = \"sync\"\n";
  r = run_shell("HPM_PS_TOKEN=x " + hpm_binary() + " ps serve " + job.config + " --task 0");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(std::regex_search(r.output, std::regex(job.config + ":[0-9]+:1: unknown key 'mdoe' "
                                                                  "in \\[ps\\]")))
      << r.output;
  PsJob other(1, 1, 1);
  r = run_hpm("ps coordinator " + other.config + " --set ps.mode=eventual");
  EXPECT_EQ(r.code, 1);
  // The value came from --set, so the error names the override rather than the file.
  EXPECT_NE(r.output.find("--set ps.mode=eventual: [ps] mode must be \"async\", \"ssp\" or "
                          "\"sync\", got \"eventual\""),
            std::string::npos)
      << r.output;
}

// [train] settings of a Trainer run that a parameter-server job has no place for are refused,
// naming where they were given, rather than ignored.
TEST(PsCommand, TrainSettingsItCannotHonourAreRefusedWithTheirPlace) {
  PsJob job(1, 1, 1);
  struct Case {
    std::string set, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"train.checkpoint_dir=" + (job.dir / "ckpt"),
            "[train] checkpoint_dir does not apply to hpm ps: the coordinator checkpoints every "
            "parameter-server shard to [ps] checkpoint_dir"},
           {"train.tensorboard_dir=" + (job.dir / "tb"),
            "[train] tensorboard_dir is not written by hpm ps"},
           {"train.clip_grad_norm=1.0", "[train] clip_grad_norm does not reach parameter-server"},
       }) {
    for (const char* role : {"coordinator", "worker --task 0"}) {
      const CommandResult r =
          run_hpm("ps " + std::string(role) + " " + job.config + " --set " + c.set);
      EXPECT_EQ(r.code, 1) << r.output;
      EXPECT_NE(r.output.find("hpm: error: --set " + c.set + ": " + c.expect), std::string::npos)
          << r.output;
    }
  }
}

TEST(PsCommand, PortInUseIsRefusedAndAWrongTokenFailsFast) {
  PsJob job(1, 1, 1);
  const std::string port = std::to_string(20000 + (::getpid() % 2000) * 10 + 1);
  // A second server on the port of a running one must not listen too (gRPC's SO_REUSEPORT).
  const std::string script =
      "export HPM_PS_TOKEN=right; " + job.hpm("ps serve --task 0", "ps0.log") + " & PS=$!; " +
      wait_for(job.dir / "ps0.log", "listening") + "timeout 10 " + hpm_binary() + " ps serve " +
      job.config + " --task 0; echo second=$?; " +
      // The coordinator's token is not the server's: refused at once, not "unreachable" after
      // ps_wait_s (20 s).
      "S=$(date +%s); HPM_PS_TOKEN=wrong timeout 30 " + hpm_binary() + " ps coordinator " +
      job.config + "; echo coordinator=$? after=$(( $(date +%s) - S )); kill $PS; wait";
  const CommandResult r = run_shell(script);
  EXPECT_NE(r.output.find("second=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hpm: error: cannot listen on 127.0.0.1:" + port + ": port " + port +
                          " is in use"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("coordinator=1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("authentication failed: a parameter-server task refused the "
                          "coordinator's token"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("UNAUTHENTICATED: wrong token"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("after=([0-9]+)"))) << r.output;
  EXPECT_LT(std::stoi(m[1]), 10) << r.output;
}

}  // namespace
}  // namespace hpm::testing
