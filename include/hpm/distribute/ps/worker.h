// A parameter-server worker: asks the coordinator for a task, pulls the variables, runs forward
// and backward on the task's rows, pushes the gradients, reports, and asks again, until the
// coordinator says done. Its own statistics (steps/s, pull and push latency, a staleness
// histogram) travel with every request.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "hpm/autograd/autocast.h"
#include "hpm/data/in_memory.h"
#include "hpm/distribute/ps/coordinator.h"
#include "hpm/nn/module.h"
#include "hpm/nn/objective.h"

namespace hpm::distribute::ps {

struct WorkerOptions {
  int worker = 0;
  std::int64_t batch_size = 64;  // rows per task
  std::uint64_t seed = 0;        // the order of epoch e: epoch_order(n, seed, e)
  float label_smoothing = 0.0f;
  // What a task's loss and metrics are; null: classification with label_smoothing. Rows of
  // `train` are examples of any shape (images, token windows with their next tokens).
  std::shared_ptr<const nn::Objective> objective = nullptr;
  // The step's mixed precision and gradient accumulation, as the one replica step takes them
  // (distribute::ReplicaStepOptions): a task's batch in this many micro-batches, one push.
  autograd::Precision precision = autograd::Precision::F32;
  int accumulation_steps = 1;
  double slow_factor = 1.0;  // > 1: sleep (factor - 1) x the step's compute time (benchmarks)
  // Give up when the coordinator has not answered for this long.
  std::chrono::milliseconds coordinator_timeout{std::chrono::seconds(60)};
};

// The training set's order in epoch `epoch` (a Fisher-Yates shuffle): task k of the epoch trains
// on rows order[k * batch, (k + 1) * batch).
std::vector<std::int64_t> epoch_order(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

// Tasks per epoch for a training set of n rows: whole batches, a multiple of `parts`.
std::int64_t tasks_per_epoch(std::int64_t n, std::int64_t batch_size, int parts);

class Worker {
 public:
  Worker(const Cluster& cluster, std::shared_ptr<nn::Module> model, data::LabelledData train,
         const WorkerOptions& options);
  ~Worker();
  // Until the coordinator says done; PsError when it stays unreachable, or a loss is not finite.
  WorkerReport run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hpm::distribute::ps
