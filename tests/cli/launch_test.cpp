// `hpm launch` end to end, through the built binary: the ranks' environment, whole prefixed output
// lines, a failing or killed rank stopping its siblings promptly (SIGKILL after the grace period
// for one that ignores SIGTERM), SIGTERM forwarding, exit statuses and usage errors.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "common/hpm_cli.h"
#include "common/temp_dir.h"

namespace hpm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using hpm::testing::contains;

struct Outcome {
  int code = -1;       // exit status, or 128 + signal
  std::string output;  // stdout and stderr
  Clock::duration took{};
};

// Runs `hpm ARGS...`; after each read, on_output(all output so far, pid) may signal it.
Outcome hpm(const std::vector<std::string>& args,
            const std::function<void(const std::string&, pid_t)>& on_output = {}) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(p[1], STDOUT_FILENO);
    ::dup2(p[1], STDERR_FILENO);
    ::close(p[0]);
    ::close(p[1]);
    const std::string binary = std::string(HPM_BINARY_DIR) + "/hpm";
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(p[1]);
  Outcome r;
  const auto limit = t0 + 30s;
  for (;;) {
    pollfd pfd{p[0], POLLIN, 0};
    ::poll(&pfd, 1, 100);
    if (pfd.revents & (POLLIN | POLLHUP)) {
      char buf[65536];
      const ssize_t n = ::read(p[0], buf, sizeof buf);
      if (n <= 0) break;
      r.output.append(buf, static_cast<std::size_t>(n));
      if (on_output) on_output(r.output, pid);
    }
    if (Clock::now() > limit) {
      ::kill(pid, SIGKILL);
      ADD_FAILURE() << "hpm launch hung; output so far:\n" << r.output;
      break;
    }
  }
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.took = Clock::now() - t0;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(HpmLaunch, RanksSeeTheirEnvironment) {
  const std::string show =
      "echo r=$HPM_RANK/$HPM_WORLD_SIZE l=$HPM_LOCAL_RANK rv=$HPM_RENDEZVOUS t=$HPM_TIMEOUT";
  Outcome r = hpm({"launch", "-n", "3", "--", "sh", "-c", show});
  EXPECT_EQ(r.code, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(r.output, m, std::regex(R"(\[0\] r=0/3 l=0 rv=(/\S*hpm-launch-\S+) t=\n)")))
      << r.output;
  EXPECT_TRUE(contains(r.output, "[1] r=1/3 l=1 rv=" + m[1].str())) << r.output;
  EXPECT_TRUE(contains(r.output, "[2] r=2/3 l=2 rv=" + m[1].str())) << r.output;
  EXPECT_FALSE(std::filesystem::exists(m[1].str()))
      << "the temporary rendezvous directory is removed";
  EXPECT_EQ(lines_of(r.output).size(), 3u) << r.output;

  testing::TempDir dir;
  r = hpm({"launch", "-n", "2", "--rendezvous-dir", dir.path(), "--timeout", "2.5", "--", "sh",
           "-c", show});
  EXPECT_EQ(r.code, 0) << r.output;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(\[1\] r=1/2 l=1 rv=(\S+) t=2.5\n)")))
      << r.output;
  EXPECT_EQ(m[1].str().rfind(dir.path() + "/hpm-launch-", 0), 0u)
      << "a fresh directory inside " << dir.path();
  EXPECT_FALSE(std::filesystem::exists(m[1].str()));
  EXPECT_TRUE(std::filesystem::is_directory(dir.path()));

  r = hpm({"launch", "-n", "2", "--rendezvous", "127.0.0.1:0", "--", "sh", "-c", show});
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex(R"(\[0\] r=0/2 l=0 rv=127\.0\.0\.1:[1-9][0-9]* t=)")))
      << r.output;
}

// Three ranks write long lines (longer than a pipe's atomic write) as fast as they can, and a line
// in two pieces with a pause between: every line must come out whole, prefixed with its rank, in
// order.
TEST(HpmLaunch, OutputLinesArePrefixedAndNeverInterleaved) {
  const std::string program =
      "printf 'half-'; sleep 0.2; echo done; "
      "awk -v r=$HPM_RANK 'BEGIN { s = sprintf(\"%6000s\", \"\"); gsub(/ /, \"x\", s); "
      "for (i = 0; i < 300; i++) print r \"-\" i \"-\" s }'; "
      "echo to-stderr-$HPM_RANK >&2";
  const Outcome r = hpm({"launch", "-n", "3", "--", "sh", "-c", program});
  ASSERT_EQ(r.code, 0) << r.output.substr(0, 2000);
  const std::regex long_line(R"(\[(\d)\] (\d)-(\d+)-x{6000})");
  std::map<int, int> next;  // rank -> next line number expected
  int halves = 0, stderr_lines = 0;
  for (const auto& line : lines_of(r.output)) {
    std::smatch m;
    if (std::regex_match(line, m, long_line)) {
      const int rank = std::stoi(m[1].str());
      EXPECT_EQ(m[2].str(), m[1].str()) << "a line relayed under another rank's prefix";
      EXPECT_EQ(std::stoi(m[3].str()), next[rank]++) << "rank " << rank << " out of order";
    } else if (std::regex_match(line, std::regex(R"(\[\d\] half-done)"))) {
      ++halves;
    } else if (std::regex_match(line, std::regex(R"(\[(\d)\] to-stderr-\1)"))) {
      ++stderr_lines;
    } else {
      ADD_FAILURE() << "mangled line: " << line.substr(0, 120) << " (" << line.size() << " bytes)";
    }
  }
  EXPECT_EQ(halves, 3);
  EXPECT_EQ(stderr_lines, 3);
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(next[rank], 300) << "rank " << rank;
}

TEST(HpmLaunch, FailingRankStopsTheOthersPromptly) {
  const Outcome r =
      hpm({"launch", "-n", "3", "--", "sh", "-c",
           "if [ $HPM_RANK = 1 ]; then sleep 0.2; echo last words; exit 3; fi; exec sleep 30"});
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(contains(
      r.output,
      "[1] last words\nhpm launch: rank 1 exited with status 3; stopping the other ranks\n"))
      << r.output;
  EXPECT_LT(r.took, 3s) << "the sleeping ranks were not stopped";
}

TEST(HpmLaunch, KilledRankIsNamedAndARankIgnoringTermIsKilledAfterTheGrace) {
  const Outcome r =
      hpm({"launch", "-n", "2", "--grace", "0.5", "--", "sh", "-c",
           "if [ $HPM_RANK = 0 ]; then sleep 0.2; kill -KILL $$; fi; trap '' TERM; sleep 30"});
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  EXPECT_TRUE(
      contains(r.output, "hpm launch: rank 0 killed by signal SIGKILL; stopping the other ranks"))
      << r.output;
  EXPECT_TRUE(
      contains(r.output, "hpm launch: rank 1 still running 0.5 s after SIGTERM: sending SIGKILL"))
      << r.output;
  EXPECT_LT(r.took, 4s);
}

TEST(HpmLaunch, ForwardsSigtermToEveryRank) {
  bool sent = false;
  const Outcome r =
      hpm({"launch", "-n", "2", "--", "sh", "-c",
           "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"},
          [&](const std::string& out, pid_t pid) {
            if (!sent && contains(out, "[0] ready") && contains(out, "[1] ready")) {
              ::kill(pid, SIGTERM);
              sent = true;
            }
          });
  ASSERT_TRUE(sent) << r.output;
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.output;
  EXPECT_TRUE(contains(r.output, "hpm launch: got SIGTERM: forwarding it to the ranks"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "[0] got-term") && contains(r.output, "[1] got-term")) << r.output;
  EXPECT_FALSE(contains(r.output, "exited with status 7"))
      << "an interrupted run reports no rank failure";
  EXPECT_LT(r.took, 5s);
}

TEST(HpmLaunch, ExitStatusesAndUsageErrors) {
  EXPECT_EQ(hpm({"launch", "-n", "4", "--", "true"}).code, 0);
  Outcome r = hpm({"launch", "-n", "2", "--", "/nonexistent/program", "x"});
  EXPECT_EQ(r.code, 127) << r.output;
  EXPECT_TRUE(contains(
      r.output, "[0] hpm launch: cannot run /nonexistent/program: No such file or directory"))
      << r.output;
  EXPECT_EQ(hpm({"launch", "-n", "2"}).code, 2);                // no program
  EXPECT_EQ(hpm({"launch", "-n", "0", "--", "true"}).code, 2);  // no ranks
  EXPECT_EQ(hpm({"launch", "--", "true"}).code, 2);             // -n is required
  EXPECT_EQ(
      hpm({"launch", "-n", "2", "--rendezvous", "h:1", "--rendezvous-dir", "/tmp", "--", "true"})
          .code,
      2);
  r = hpm({"launch", "-n", "2", "--rendezvous", "no-port", "--", "true"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, "rendezvous address 'no-port': no port")) << r.output;
  r = hpm({"launch", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.output, "Exit status: 0 when every rank exits 0")) << r.output;
  EXPECT_TRUE(contains(hpm({"--help"}).output, "launch"));
}

TEST(HpmLaunch, FailuresThatRecurAreNotRestarted) {
  Outcome r = hpm({"launch", "-n", "2", "--max-restarts", "3", "--", "/nonexistent/program"});
  EXPECT_EQ(r.code, 127) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "hpm launch: exit status 127 means the program was not found: a restart "
                       "would fail the same way; giving up after 0 restart(s)"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "restarting")) << r.output;
  // Bad input (exit 1) fails the same way again.
  r = hpm({"launch", "-n", "1", "--max-restarts", "3", "--", "sh", "-c",
           "echo attempt $HPM_RESTART; exit 1"});
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[0] attempt 0")) << r.output;
  EXPECT_FALSE(contains(r.output, "[0] attempt 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "exit status 1 means bad input")) << r.output;
}

// A lost peer (exit 5: a timeout, a dead or stopped rank) is worth a restart; out of memory
// (6) recurs.
TEST(HpmLaunch, ALostPeerIsRestartedAndOutOfMemoryIsNot) {
  Outcome r = hpm({"launch", "-n", "2", "--max-restarts", "1", "--restart-delay", "0.1", "--", "sh",
                   "-c", "[ \"$HPM_RESTART\" = 1 ] || exit 5"});
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "all ranks finished after 1 restart(s)")) << r.output;
  r = hpm({"launch", "-n", "1", "--max-restarts", "3", "--", "sh", "-c", "exit 6"});
  EXPECT_EQ(r.code, 6) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "exit status 6 means the training step does not fit the memory "
                       "budget: a restart would fail the same way"))
      << r.output;
}

// A peer that never arrives: the rendezvous times out with exit 5, which a launcher restarts
// (it was 1, "bad input", and never restarted).
TEST(HpmLaunch, ARendezvousTimeoutExitsAsALostPeer) {
  testing::TempDir dir;
  testing::write_synthetic_mnist(dir.path(), 64, 16);
  const Outcome r = hpm({"train", testing::small_mlp_config(dir, dir.path()), "--set",
                         "strategy.kind=\"multi_worker_mirrored\"", "--set", "strategy.timeout_s=1",
                         "--rank", "0", "--world-size", "2", "--rendezvous", dir / "rdzv"});
  EXPECT_EQ(r.code, 5) << r.output;
  EXPECT_TRUE(contains(r.output, "rank(s) 1")) << r.output;
}

// A rank's command that is a script starting hpm (not exec'ing it): when the launcher is killed
// with SIGKILL, PR_SET_PDEATHSIG reaches only the script; the hpm under it sees the launcher's
// lifeline close and stops (here an inner `hpm launch`, which stops its own rank in turn).
TEST(HpmLaunch, HpmUnderAScriptStopsWhenTheLauncherIsKilled) {
  testing::TempDir dir;
  const std::string inner = testing::hpm_binary() + " launch -n 1 -- sh -c 'echo $$ > " +
                            dir.path() + "/pid.$$; echo ready; exec sleep 30'; echo wrapper done";
  bool killed = false;
  const Outcome r =
      hpm({"launch", "-n", "2", "--", "sh", "-c", inner}, [&](const std::string& out, pid_t pid) {
        std::size_t ready = 0;
        for (auto at = out.find("ready"); at != std::string::npos; at = out.find("ready", at + 1))
          ++ready;
        if (!killed && ready == 2) {
          ::kill(pid, SIGKILL);
          killed = true;
        }
      });
  ASSERT_TRUE(killed) << r.output;
  std::vector<pid_t> sleepers;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    sleepers.push_back(std::stoi(e.path().filename().string().substr(4)));
  ASSERT_EQ(sleepers.size(), 2u);
  // Gone, or a zombie its new parent has not reaped yet.
  const auto alive = [](pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pid_field, comm, state;
    return static_cast<bool>(stat >> pid_field >> comm >> state) && state != "Z";
  };
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline && (alive(sleepers[0]) || alive(sleepers[1])))
    std::this_thread::sleep_for(50ms);
  for (pid_t pid : sleepers) {
    EXPECT_FALSE(alive(pid)) << "pid " << pid << " outlived its launcher";
    ::kill(pid, SIGKILL);
  }
}

TEST(HpmLaunch, RestartsWaitLongerEachTime) {
  // Killed twice, then it succeeds: restarts after 0.3 s, then 0.6 s.
  const Outcome r = hpm({"launch", "-n", "1", "--max-restarts", "3", "--restart-delay", "0.3", "--",
                         "sh", "-c", "[ \"$HPM_RESTART\" = 2 ] || kill -KILL $$"});
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "hpm launch: restarting all 1 ranks (restart 1 of 3) in 0.3 s"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "hpm launch: restarting all 1 ranks (restart 2 of 3) in 0.6 s"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "all ranks finished after 2 restart(s)")) << r.output;
  EXPECT_GE(r.took, 900ms) << r.output;
}

}  // namespace
}  // namespace hpm
