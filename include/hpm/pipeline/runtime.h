// The pipeline runtime: a model cut into chunks (slices of a Sequential sharing its modules) runs
// on K Devices as a schedule orders it. Activations travel forward and their gradients backward
// through a Communicator's send/recv, so the same code drives K threads of one process (local
// backend) and K processes or hosts (gloo), one device each.
//
// One call of forward_backward is one mini-batch: it is split into M micro-batches along rows,
// each micro-batch's loss is weighted by its share of the rows, and the parameters' gradients are
// accumulated over all micro-batches. The caller then applies one optimizer step: the update is
// the unsplit model's up to floating-point reassociation.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "hpm/autograd/autocast.h"
#include "hpm/comm/communicator.h"
#include "hpm/nn/module.h"
#include "hpm/nn/objective.h"
#include "hpm/nn/recompute.h"
#include "hpm/pipeline/schedule.h"
#include "hpm/pipeline/simulator.h"

namespace hpm::pipeline {

using nn::LossFn;

struct PipelineOptions {
  int stages = 2;         // K devices
  int micro_batches = 4;  // M
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int chunks_per_stage = 1;                        // v (interleaved only)
  std::size_t device_budget = Device::kUnlimited;  // bytes, per stage's Device
  int threads_per_stage = 1;                       // kernel threads of each stage
  std::uint64_t seed = 0;  // stage d's generator: Generator(seed + 7919 * (d + 1))
  comm::Milliseconds timeout{std::chrono::seconds(60)};
  // Each chunk's forward of a micro-batch keeps only its input and re-runs in backward (GPipe's
  // re-materialization): never, always, or for every micro-batch but the last, whose backward
  // follows at once (torchgpipe's except_last).
  nn::RecomputeMode recompute = nn::RecomputeMode::Never;
  // Each stage runs its forwards and backwards under this autocast precision
  // (autograd/autocast.h), as the one replica step does.
  autograd::Precision precision = autograd::Precision::F32;
};

// What one mini-batch did, and where the time went.
struct StepStats {
  nn::Metrics metrics;  // the objective's, from the last stage (empty on the others)
  double loss_sum = 0;  // metrics' "loss" sum: over the weight units, of the unweighted loss
  std::int64_t rows = 0;
  bool finite = true;
  double wall_s = 0;                    // from the first action to the last, all stages
  std::vector<double> busy_s;           // per stage: time in forward and backward
  double bubble = 0;                    // 1 - sum(busy) / (stages * wall)
  std::vector<ChunkCost> chunk_costs;   // measured: mean F and B per micro-batch, per chunk
  std::vector<std::size_t> peak_bytes;  // per stage: its Device's peak during the step
};

class Pipeline {
 public:
  // All K stages in this process, each on a thread and a Device of its own ("stage0", ...).
  // `chunks` has K * v entries; chunk c runs on stage c % K. The chunks' parameters and buffers
  // move onto their stage's Device.
  Pipeline(std::vector<std::shared_ptr<nn::Module>> chunks, const PipelineOptions& options);
  // Stage `comm->rank()` of a pipeline spread over `comm->size()` processes: every process
  // passes the whole chunk list (built alike) and runs only its own chunks.
  Pipeline(std::vector<std::shared_ptr<nn::Module>> chunks, const PipelineOptions& options,
           comm::CommunicatorPtr comm);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Every process passes the same x and y (rows = the mini-batch); stage 0 reads x, the last
  // chunk's stage reads y. Gradients accumulate into the parameters' .grad.
  StepStats forward_backward(const nn::Batch& batch, const nn::Objective& objective);
  // The same with a loss of (outputs, targets), reported as classification is.
  StepStats forward_backward(const Tensor& x, const Tensor& y, const LossFn& loss);

  // Runs job(d) for each of this process's stages d, on the stage's own thread when the stages
  // are threads (at once), else one after another; rethrows the first stage's exception after
  // all have finished. For per-stage work between steps, such as each stage's share of the
  // optimizer update.
  void on_stages(const std::function<void(int)>& job);

  const Schedule& schedule() const { return schedule_; }
  const PipelineOptions& options() const { return options_; }
  // For the steps that follow (the stages read it when a step starts).
  void set_precision(autograd::Precision p) { options_.precision = p; }
  // Stage d's Device (in a multi-process pipeline only this process's stage has one).
  Device& device(int stage) const;
  bool owns(int stage) const;

 private:
  class Stage;
  void start_threads();
  void run_on_stages(const std::function<void(int)>& job);
  PipelineOptions options_;
  Schedule schedule_;
  std::vector<std::shared_ptr<nn::Module>> chunks_;
  std::vector<std::unique_ptr<Stage>> stages_;  // null where another process runs the stage
  struct Threads;
  std::unique_ptr<Threads> threads_;
  bool failed_ = false;  // a step threw: messages may be left in flight, so no further step
};

// Cuts `model` at `boundaries` (b[0] = 0 < b[1] < ... < b[n] = model.size()) into n slices.
std::vector<std::shared_ptr<nn::Module>> cut(const nn::Sequential& model,
                                             const std::vector<int>& boundaries);

}  // namespace hpm::pipeline
