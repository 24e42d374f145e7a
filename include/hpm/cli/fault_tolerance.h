// What `hpm train` adds for fault tolerance: preemption signals, the backup report, and a fault
// injector for tests of worker restart.
#pragma once
#include <atomic>
#include <cstdio>
#include <memory>

#include "hpm/train/trainer.h"

namespace hpm::cli {

// The exit status of a run that was preempted (SIGTERM or SIGINT) after writing its backup: the
// same command, run again, continues from it.
inline constexpr int kExitPreempted = 4;

// Installs SIGTERM and SIGINT handlers that set the returned flag (once; the second signal of
// either kind kills as usual, for a user who really means it).
const std::atomic<bool>* install_preemption_handlers();

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
