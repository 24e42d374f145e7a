// The process supervisor of `hpm launch -n N [--rendezvous HOST:PORT | --rendezvous-dir DIR]
// [--timeout S] -- PROGRAM ARGS...`, usable without the command line: it starts N local ranks of
// PROGRAM with the environment the gloo backend reads (HPM_RANK,
// HPM_LOCAL_RANK, HPM_WORLD_SIZE, HPM_RENDEZVOUS, HPM_TIMEOUT), prefixes every line they print
// with "[rank] ", forwards SIGINT/SIGTERM to them, and stops them all when one fails.
#pragma once
#include <string>
#include <vector>

namespace hpm::launch {

// Exit statuses of a rank that the supervisor reads (and hpm train returns): which failures a
// restart may cure.
// A run preempted (SIGTERM or SIGINT) after writing its backup: the same command, run again,
// continues from it.
inline constexpr int kExitPreempted = 4;
// A peer was lost: a collective or rendezvous timed out, or a rank died (comm::CommError). A
// restart may well succeed, so `--max-restarts` restarts the group.
inline constexpr int kExitPeerLost = 5;
// The training step does not fit the device's memory budget; the same config meets it again.
inline constexpr int kExitOutOfMemory = 6;

// Each rank gets the read end of a pipe whose write end only the supervisor holds, its number in
// this variable: a rank sees the pipe close when the supervisor dies, even by SIGKILL.
inline constexpr const char* kLauncherFdVariable = "HPM_LAUNCHER_FD";

// The text `hpm launch --help` ends with: what each rank gets, restarts, exit statuses.
extern const char* const kHelpFooter;

struct LaunchOptions {
  int processes = 0;       // -n (required unless --ps and --workers)
  std::string rendezvous;  // HOST:PORT: rank 0 hosts the TCP store (port 0: pick a free one)
  std::string
      rendezvous_dir;  // where to make the run's FileStore directory (removed after); default /tmp
  double timeout_s = 0;  // exported as HPM_TIMEOUT when > 0
  double grace_s = 5;    // from SIGTERM to SIGKILL when the ranks are stopped
  // When a rank fails, stop the rest and start the whole group again (a fresh rendezvous; every
  // rank gets HPM_RESTART = the attempt number), at most this many times: with a backup_dir the
  // restarted ranks continue from the last backup.
  // A failure that would only recur is not restarted: bad input (exit 1), usage (2), a non-finite
  // loss (3: the same seed meets it again), a program that cannot be run (126) or found (127).
  int max_restarts = 0;
  // Seconds before the first restart, doubled before each next one (at most 60 s).
  double restart_delay_s = 1;
  std::vector<std::string> command;
  // A parameter-server job (`--ps P --workers W`, instead of -n): rank 0 is the coordinator,
  // ranks 1..P the parameter-server tasks, the rest the workers. Each gets HPM_PS_ROLE
  // (coordinator | ps | worker), HPM_PS_INDEX and HPM_PS_CLUSTER (JSON addresses on free
  // loopback ports), and HPM_PS_TOKEN (a random one unless already set).
  int ps_tasks = 0, ps_workers = 0;
  std::string ps_cluster;  // filled by run_launch
};

// Runs the ranks until all have exited; returns the exit status described in `hpm launch --help`.
int run_launch(const LaunchOptions& options);

}  // namespace hpm::launch
