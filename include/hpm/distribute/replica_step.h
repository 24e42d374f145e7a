// The one training step of a replica, shared by every path that trains (the Trainer, every
// strategy, the pipeline's last stage, the parameter-server worker, distillation): the model's
// forward on each micro-batch, the Objective's loss and metrics, the non-finite verdict, the
// weighting that makes micro-batches and replicas of any size add up to the step's mean, and
// backward (with the reducer's hooks all-reducing as gradients become ready).
//
// Weighting: a micro-batch holding w of the step's W weight units (rows, or counted tokens) over
// R replicas in sync scales its mean loss by R * w / W, so that summing micro-batches and then
// averaging over replicas gives the gradient of the whole step's mean.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "hpm/autograd/autocast.h"
#include "hpm/distribute/reducer.h"
#include "hpm/nn/module.h"
#include "hpm/nn/objective.h"

namespace hpm::distribute {

// The micro-batches `rows` rows split into for accumulation over `steps`: [first, count) ranges of
// ceil(rows / steps) rows each, the last possibly smaller (fewer than `steps` when rows do not
// fill them; none for 0 rows). Throws std::invalid_argument when steps < 1.
std::vector<std::pair<std::int64_t, std::int64_t>> micro_batches(std::int64_t rows, int steps);

// One micro-batch's loss, ready for backward: the objective on `outputs`, scaled by `scale`
// (R * w / W above; no multiplication at exactly 1, so a whole-batch step is the plain mean).
struct WeightedLoss {
  Tensor loss;  // what backward runs on
  nn::Metrics metrics;
  Tensor unscaled;  // the mean loss, detached: what read() reads
  float value = 0;  // the unscaled mean loss, once read
  bool finite = true;
  // Reads the loss to the host (a wait for the device), setting value and finite.
  void read();
};
// With read_now false the loss stays on the device until read() (and metrics stay pending).
WeightedLoss weighted_loss(const nn::Objective& objective, const Tensor& outputs,
                           const nn::Batch& micro, double scale, bool read_now = true);

struct ReplicaStepOptions {
  int micro_batches = 1;       // gradient accumulation
  int replicas_in_sync = 1;    // R
  double step_weight = 0;      // W, over every replica; 0: this replica's batch is the step
  Reducer* reducer = nullptr;  // all-reduces during the last micro-batch's backward
  // Forward and backward run under autograd::AutocastScope(precision) on the calling thread.
  autograd::Precision precision = autograd::Precision::F32;
  // Called with each micro-batch's verdict before its backward (and so before this replica joins
  // an all-reduce): replicas in one process learn of a NaN before anyone updates.
  std::function<void(bool finite)> on_loss;
  // Leaves the verdict to the caller, who issues its update first, gated on the device by the
  // returned `losses` (Optimizer::gate_on), and then calls ReplicaStepResult::settle(): nothing is
  // read here; each micro-batch's loss and metrics start their read right after its forward, so
  // that settle() waits for the forwards' work only and a GPU stays busy with the backward and the
  // update meanwhile. `read_with` (values on the model's device) joins the first micro-batch's
  // read, as they are after its forward: the verdict of the update before it. Not with a reducer
  // or on_loss, which read before the backward.
  bool read_later = false;
  std::vector<Tensor> read_with;
};

struct ReplicaStepResult {
  nn::Metrics metrics;  // summed over the micro-batches
  std::int64_t rows = 0;
  bool finite = true;
  float bad_value = 0;  // the first non-finite loss
  // With read_later: the counted micro-batches' mean losses (unscaled, unread), for the gate.
  std::vector<Tensor> losses;
  // With read_later, after settle(): read_with's values (their first elements).
  std::vector<double> read_with;
  // With read_later: waits for the reads begun after the forwards and sets finite, bad_value,
  // read_with and the metrics' values; throws what the device owes the host for that work (a
  // GPU's failed index check: std::out_of_range). Nothing to do otherwise.
  void settle();
  // The losses' reads, each loss first in its own (with read_with behind the first's).
  std::vector<std::shared_ptr<HostRead>> reads;
  std::size_t read_with_count = 0;
};

// Forward and backward of `model` on `batch` (gradients accumulate into the parameters' .grad:
// zero them first). With a reducer or an on_loss callback, each micro-batch's loss is read before
// its backward (a non-finite one stops a step without a reducer there; with one, backward still
// runs so that the other replicas' all-reduces complete). Otherwise nothing is read until every
// backward was issued: the losses and metrics are read once, at the end (on a GPU, the step's one
// wait for the device), and a non-finite loss is reported then. Either way the caller must not
// update when `finite` is false.
ReplicaStepResult replica_step(nn::Module& model, const nn::Objective& objective,
                               const nn::Batch& batch, const ReplicaStepOptions& options);

}  // namespace hpm::distribute
