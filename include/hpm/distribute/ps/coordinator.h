// The coordinator (TensorFlow's ClusterCoordinator, the "chief"): gives the parameter-server
// tasks their variables, hands out units of work ("tasks": one batch, or one worker's part of a
// synchronous step) to workers that ask, at least once, and checkpoints every shard at once.
//
// - A worker silent for `heartbeat_timeout` has its in-flight tasks handed to others (counted in
//   `rescheduled`); it rejoins when it calls again (a restarted process has a new incarnation).
// - Sync: the tasks of step s+1 wait until every part of step s is done. SSP: a worker more than
//   `staleness` tasks ahead of the slowest live worker waits.
// - A parameter-server task that stops answering or comes back empty makes the coordinator pause,
//   wait for all tasks to answer, restore every shard from the last consistent checkpoint (or the
//   initial variables if there is none), and continue from there (counted in `ps_restores`).
// - With a checkpoint_dir holding a checkpoint at start, training continues from it.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hpm/distribute/ps/client.h"
#include "hpm/distribute/ps/cluster.h"
#include "hpm/nn/module.h"

namespace hpm::distribute::ps {

struct WorkerReport {
  int worker = 0;
  std::int64_t steps = 0;
  double seconds = 0;
  std::vector<std::int64_t> staleness_histogram;
  double pull_ms_p50 = 0, pull_ms_p99 = 0, push_ms_p50 = 0, push_ms_p99 = 0;
  std::int64_t failed_tasks = 0;
  double steps_per_s() const { return seconds > 0 ? static_cast<double>(steps) / seconds : 0; }
};

struct EpochReport {
  std::int64_t epoch = 0;
  double seconds = 0;  // since the first task was handed out (wall)
  double train_loss = 0, train_accuracy = 0;
  double test_loss = 0, test_accuracy = 0;  // filled by the on_epoch callback
};

struct CoordinatorReport {
  std::vector<EpochReport> epochs;
  std::vector<WorkerReport> workers;
  std::int64_t tasks = 0;
  std::int64_t rescheduled = 0;     // tasks of silent or restarted workers given to others
  std::int64_t failed = 0;          // tasks a worker reported it could not push (run again)
  std::int64_t duplicate_done = 0;  // a task reported done twice (at-least-once)
  std::int64_t ps_restores = 0;
  std::int64_t checkpoints = 0;
  std::string restored_from;  // the checkpoint training started from, if any
  double seconds = 0;         // from the first task handed out to the last one done
  double tasks_per_s() const { return seconds > 0 ? static_cast<double>(tasks) / seconds : 0; }
};

struct CoordinatorOptions {
  Mode mode = Mode::kAsync;
  int staleness = 2;  // SSP bound, in tasks
  std::int64_t epochs = 1;
  std::int64_t tasks_per_epoch = 1;  // sync: steps per epoch x workers
  OptimizerSpec optimizer;
  std::function<float(std::int64_t epoch)> lr;  // default: optimizer.lr
  std::string checkpoint_dir;                   // empty: no checkpoints
  std::int64_t checkpoint_every_tasks = 0;      // 0: at each epoch end
  // Recorded in every checkpoint's manifest (PsCheckpoint::metadata): what describes the job.
  std::map<std::string, std::string> metadata;
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds ps_wait{std::chrono::seconds(60)};  // for tasks to (re)appear
  // After each epoch's tasks are done, with the variables pulled into `vars` (the constructor's):
  // evaluate, and fill in test_loss/test_accuracy. The next epoch's tasks wait until it returns,
  // so it sees the variables exactly as the epoch left them.
  std::function<void(EpochReport&)> on_epoch;
  std::function<void(const std::string&)> log;
  bool shutdown_servers = false;  // at the end, ask every parameter-server task to exit  //
                                  // progress and fault lines (default: stderr)
};

class Coordinator {
 public:
  // `vars`: the model's variables with their initial values (pulled into after each epoch):
  // ps_variables(model), its parameters and running statistics, as the workers list them.
  // Listens on `address` (port 0: a free one).
  Coordinator(const Cluster& cluster, const CoordinatorOptions& options, nn::NamedTensors vars,
              const std::string& address);
  ~Coordinator();
  int port() const;
  // Initializes (or restores) the shards, serves workers until every task is done, returns.
  CoordinatorReport run();

 private:
  class Service;
  std::unique_ptr<Service> service_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpm::distribute::ps
