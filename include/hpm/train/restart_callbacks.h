// Callbacks for runs that restart: what a restored backup was, and a fault injector for the tests
// of worker restart and preemption.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "hpm/train/trainer.h"

namespace hpm::train {

// Prints which backup a run continued from, and each newer one skipped as unusable (to stderr).
class BackupRestoreReport : public Callback {
 public:
  void on_backup_restored(Trainer&, const std::string& dir,
                          const std::vector<std::string>& skipped) override;
};

// HPM_FAULT_AT_STEP="RANK:STEP" makes worker RANK kill itself with SIGKILL after global step STEP
// ("RANK:STEP:TERM": send itself SIGTERM, as a preempting scheduler would), only in the first
// attempt of a launch (HPM_RESTART unset or 0), so a restarted group runs through. Null when the
// variable is unset or names another rank; std::invalid_argument when it is malformed.
std::shared_ptr<Callback> fault_injector_from_env(int worker_rank);

}  // namespace hpm::train
