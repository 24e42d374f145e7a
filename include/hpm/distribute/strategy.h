// Distribution strategies after tf.distribute: the same training step on one device, on several
// replicas in one process (Mirrored), on replicas in several processes or hosts
// (MultiWorkerMirrored), or on replicas that compute while the variables live in one place
// (CentralStorage).
//
//   auto strategy = distribute::make_mirrored({.replicas = 2});
//   strategy->scope(build_model, build_optimizer);   // every replica's variables, mirrored
//   nn::LanguageModelling objective;
//   distribute::StepResult r = strategy->train_step({x, y}, objective, 0.0f);  // one global batch
//
// Synchronous strategies keep every replica identical: N steps on R replicas with global batch B
// match one device with batch B up to floating-point reassociation (tests/dist). Local replicas
// run on threads of their own, each with its share of the CPU budget (`threads`) and its own
// random generator (seed, replica).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hpm/comm/communicator.h"
#include "hpm/distribute/reducer.h"
#include "hpm/distribute/replica_step.h"
#include "hpm/nn/module.h"
#include "hpm/nn/objective.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/random.h"

namespace hpm::distribute {

using ModelFactory = std::function<std::shared_ptr<nn::Module>()>;
using OptimizerFactory = std::function<std::shared_ptr<optim::Optimizer>(nn::Module&)>;
using nn::LossFn;

// What one step did, over all replicas in sync (every worker's share of the global batch).
struct StepResult {
  nn::Metrics metrics;       // the objective's, summed over every replica
  double loss = 0;           // metrics' "loss": the mean over the global batch's weight units
  std::int64_t correct = 0;  // metrics' "accuracy" hits, where the objective counts them
  std::int64_t samples = 0;  // rows
  bool finite = true;        // false: some replica's loss was NaN or infinite; nothing was updated
  bool stop_requested = false;  // some worker asked to stop after this step (all agree on it)
};

struct ReplicaContext {
  int replica_id_in_sync = 0;  // worker_rank * local_replicas + local replica
  int num_replicas_in_sync = 1;
  nn::Module& model;
  optim::Optimizer& optimizer;
  // tf.distribute's ReplicaContext.all_reduce: the sum (or mean, or max) of `values` over every
  // replica in sync, in place. Every replica must call it, in the same order, with tensors of the
  // same shape: a custom loop under Strategy::run uses it for whatever must agree.
  std::function<void(Tensor& values, comm::ReduceOp op)> all_reduce;
};

struct StrategyOptions {
  int replicas = 1;        // local replicas (threads) in this process
  int threads = 1;         // the process's CPU budget, shared among its replicas
  std::uint64_t seed = 0;  // replica r draws from Generator(seed + 1000003 * (r + 1))
  ReducerOptions reducer;
  comm::Algorithm algorithm = comm::Algorithm::kAuto;
  comm::Milliseconds timeout{std::chrono::seconds(60)};
  // false: every worker is given the same global batch and trains on its slice of the rows (the
  // exact single-device arithmetic). true: each worker's input is already its own shard (the
  // dataset was sharded by files or elements), of equal size on every worker.
  bool per_worker_batches = false;
  // Gradient accumulation: each replica's rows of a batch run as this many micro-batches (see
  // micro_batches), their gradients summed, then one synchronization and one optimizer step. The
  // update equals the whole batch's: each micro-batch's mean loss is weighted by its share of the
  // rows. Only the last micro-batch's backward all-reduces (the reducer's NoSync before it), and
  // activation memory shrinks by about this factor.
  int accumulation_steps = 1;
  // Mixed precision of every replica's forward and backward (autograd/autocast.h).
  autograd::Precision precision = autograd::Precision::F32;
};

// Sums `metrics` (entry by entry: every worker runs the same objective, so they line up) and
// `counters` over every worker of `workers`, in one all-reduce; nothing without peers. Fills
// result's loss and correct ("accuracy" hits) from the metrics.
void all_reduce_metrics(nn::Metrics& metrics, std::vector<double>& counters,
                        comm::Communicator* workers);
void set_from_metrics(StepResult& result);

class Strategy {
 public:
  virtual ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  virtual std::string name() const = 0;  // "one_device", "mirrored", ...
  int local_replicas() const { return options_.replicas; }
  int worker_rank() const { return worker_rank_; }
  int num_workers() const { return num_workers_; }
  int num_replicas_in_sync() const { return local_replicas() * num_workers_; }

  // Builds every local replica's model and optimizer (the factories run once per replica, on the
  // calling thread; replica 0 first, and the default generator is left as after that first call)
  // and mirrors replica 0's values (worker 0's, across workers) to all of them. With several
  // local replicas, the calling thread's kernels drop to one thread: the replicas' threads share
  // `threads` among them.
  virtual void scope(const ModelFactory& model_fn, const OptimizerFactory& optimizer_fn);

  // The variables as the user sees them: what to evaluate and checkpoint.
  virtual std::shared_ptr<nn::Module> model() const;
  virtual std::shared_ptr<optim::Optimizer> optimizer() const;
  // After the primary copy was changed from outside (a checkpoint restored): copies its
  // parameters, buffers and optimizer state to every replica.
  virtual void mirror_from_primary();
  // Brings this worker's copy of the whole model (parameters, buffers, optimizer state) up to
  // date, for strategies whose workers' copies drift between steps: the pipeline across processes
  // updates each stage only in the process that runs it. Collective: every worker calls it at the
  // same point. The Trainer does at the end of every epoch (before it evaluates, calls back or
  // saves) and before every backup; a custom loop calls it before reading model() or optimizer().
  virtual void synchronize() {}
  // The replicas' own generators (dropout on replica threads), by global replica index, or none
  // when the replicas draw from the caller's default generator (OneDevice): what a checkpoint
  // saves beside that one, so that a resumed run draws what an uninterrupted one would. Collective
  // across workers (every worker calls it at the same point; each gets all of them).
  virtual std::vector<Generator::State> replica_generator_states();
  // Sets this worker's replicas' generators from states of every replica (as the above returns);
  // returns false, changing nothing, when they are not num_replicas_in_sync() (another replica
  // count: a resumed run draws afresh, as its rows are split otherwise anyway).
  bool set_replica_generator_states(const std::vector<Generator::State>& states);
  virtual void set_lr(float lr);
  // Micro-batches per step from now on (StrategyOptions::accumulation_steps); k >= 1.
  void set_accumulation_steps(int k);
  void set_precision(autograd::Precision p) { options_.precision = p; }
  autograd::Precision precision() const { return options_.precision; }
  int accumulation_steps() const { return options_.accumulation_steps; }

  // Seconds backward's end waited for gradient all-reduces, summed over steps, averaged over
  // local replicas: the communication that overlap did not hide (0 without a reducer).
  virtual double gradient_wait_seconds() const { return 0.0; }

  // strategy.run: fn on every local replica at once, each on its own thread.
  void run(const std::function<void(ReplicaContext&)>& fn);
  // The sum, mean or max over all replicas in sync of one value per local replica.
  double reduce(comm::ReduceOp op, const std::vector<double>& per_replica);

  // Rows [first, first + count) of the batch given to train_step that local replica r trains on.
  std::pair<std::int64_t, std::int64_t> replica_rows(std::int64_t batch, int r) const;

  // One synchronous step on a global batch: every replica runs forward and backward on its rows,
  // gradients are averaged, clipped by global norm if `clip_grad_norm` > 0, and applied. When a
  // loss is not finite, no replica updates and the result says so. `stop_requested` (this
  // worker wants to stop after this step: preemption) is combined over every worker, so all of
  // them learn it at the same step.
  virtual StepResult train_step(const nn::Batch& batch, const nn::Objective& objective,
                                float clip_grad_norm, bool stop_requested = false) = 0;
  // The same with a loss function of (outputs, targets), reported as classification is.
  StepResult train_step(const Tensor& x, const Tensor& y, const LossFn& loss, float clip_grad_norm,
                        bool stop_requested = false);

 protected:
  Strategy(const StrategyOptions& options, int worker_rank, int num_workers);
  struct Replica {
    std::shared_ptr<nn::Module> model;
    std::shared_ptr<optim::Optimizer> optimizer;
    std::unique_ptr<Generator> generator;
  };
  // Forward and backward of local replica r on its rows (as accumulation_steps micro-batches)
  // through the one replica step, weighted so that averaging gradients over all replicas gives
  // the global batch's mean. `on_loss(finite)` runs before backward (and so before this replica
  // joins any all-reduce).
  ReplicaStepResult forward_backward(int r, const nn::Batch& batch, const nn::Objective& objective,
                                     Reducer* reducer,
                                     const std::function<void(bool)>& on_loss = nullptr);
  // Adds up local outcomes (and, across workers, through `workers`) into a StepResult.
  // The metrics start from objective.metric_names(batch), so they line up across workers even
  // where a replica had no rows.
  StepResult combine(const std::vector<ReplicaStepResult>& outcomes, const nn::Objective& objective,
                     const nn::Batch& batch, comm::Communicator* workers, bool stop_requested);
  // The communicator that connects this process to the other workers (none in one process).
  virtual comm::Communicator* worker_communicator() const { return nullptr; }
  // Local replica r's communicator to every replica in sync (ReplicaContext::all_reduce); none
  // for a single replica.
  virtual comm::Communicator* replica_communicator(int /*r*/) const { return nullptr; }

  StrategyOptions options_;
  int worker_rank_, num_workers_;
  std::vector<Replica> replicas_;

 private:
  class Pool;
  std::unique_ptr<Pool> pool_;
};

std::shared_ptr<Strategy> make_one_device(const StrategyOptions& options = {});
// `options.replicas` replicas in this process, kept in sync by the local backend's all-reduce.
std::shared_ptr<Strategy> make_mirrored(const StrategyOptions& options);
// One process of many: `workers` connects the processes (the gloo backend); each holds
// `options.replicas` local replicas, reduced locally first, then across processes.
std::shared_ptr<Strategy> make_multi_worker_mirrored(comm::CommunicatorPtr workers,
                                                     const StrategyOptions& options);
// Variables on one host copy; the replicas compute gradients on copies of them, the gradients are
// averaged there and the optimizer runs once.
std::shared_ptr<Strategy> make_central_storage(const StrategyOptions& options);

}  // namespace hpm::distribute
