// The processes of a configuration's parameter-server job ([cluster], [ps]) as library calls:
// a parameter-server task, a worker, and the coordinator (the chief: it initializes the shards,
// schedules the tasks, evaluates each epoch and checkpoints), as `hpm ps serve|worker|coordinator`
// run them. Each runs until the coordinator ends the job.
#pragma once
#include <nlohmann/json.hpp>

#include "hpm/config/config.h"
#include "hpm/config/run_log.h"
#include "hpm/distribute/ps/coordinator.h"
#include "hpm/distribute/ps/server.h"

namespace hpm::config {

// Refuses (ConfigError naming the key) the [train] settings a parameter-server job has no place
// for: checkpoint_dir, backup_dir, metrics files, clipping, hpm train's own settings.
void check_ps_settings(const Config& cfg);

// Parameter-server task `task`: listens (tells where), serves until the job ends, returns its
// counters.
distribute::ps::ServerCounters run_ps_server(const Config& cfg, int task,
                                             const RunLog& log = stdout_log());

// Worker `task`: trains on the tasks the coordinator hands it; its model is built from cfg with
// [memory] applied. Throws distribute::ps::PsError when the job fails (a lost peer, a non-finite
// loss).
distribute::ps::WorkerReport run_ps_worker(const Config& cfg, int task);

// The coordinator: the whole job's schedule, with each epoch evaluated on the config's test set
// and told, and the configuration recorded in its checkpoints (hpm evaluate needs nothing else).
distribute::ps::CoordinatorReport run_ps_coordinator(const Config& cfg,
                                                     const RunLog& log = stdout_log());

// The coordinator's --report: the job's counters, every epoch and every worker.
nlohmann::json ps_job_report(const Config& cfg, const distribute::ps::CoordinatorReport& report);

}  // namespace hpm::config
