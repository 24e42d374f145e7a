// What `hpm train` adds for fault tolerance: preemption signals, the backup report, and a fault
// injector for tests of worker restart.
#pragma once
#include <atomic>
#include <cstdio>
#include <memory>

#include "hpm/launch/supervisor.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

// The exit statuses the supervisor of `hpm launch` reads (hpm/launch/supervisor.h).
using launch::kExitOutOfMemory;
using launch::kExitPeerLost;
using launch::kExitPreempted;

// Installs SIGTERM and SIGINT handlers that set the returned flag (once; the second signal of
// either kind kills as usual, for a user who really means it). They run on an alternate signal
// stack of the calling thread (call it on the thread that trains, the main one), never on the
// stack of the code they interrupt: oneDNN's GEMM kernels point that into the heap.
const std::atomic<bool>* install_preemption_handlers();

// `hpm launch` passes each rank the read end of a pipe whose write end only the launcher holds
// (launch::kLauncherFdVariable). A rank's command may be a script that starts hpm, which the
// launcher's PR_SET_PDEATHSIG does not reach: when the launcher dies, even by SIGKILL, hpm sees
// the pipe close and stops itself (SIGTERM, so a run with a backup_dir backs up first).
void watch_launcher_from_env();

// Prints which backup a run continued from, and each newer one skipped as unusable (to stderr).
class BackupReport : public train::Callback {
 public:
  void on_backup_restored(train::Trainer&, const std::string& dir,
                          const std::vector<std::string>& skipped) override;
};

// For tests of restart and preemption: HPM_FAULT_AT_STEP="RANK:STEP" makes worker RANK kill
// itself with SIGKILL after global step STEP ("RANK:STEP:TERM": send itself SIGTERM, as a
// preempting scheduler would), only in the first attempt of a launch (HPM_RESTART unset or 0),
// so a restarted group runs through. Null when the variable is unset.
std::shared_ptr<train::Callback> fault_injector_from_env(int worker_rank);

}  // namespace hpm::cli
