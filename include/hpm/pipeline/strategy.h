// Pipeline parallelism as a distribution strategy, so that the Trainer (checkpoints, backups,
// callbacks, evaluation) drives it like any other: the model (an nn::Sequential) is cut into
// chunks on the first step, by a partition profiled on that step's first micro-batch, and every
// step runs the pipeline's schedule, then one optimizer step over all chunks.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "hpm/distribute/strategy.h"
#include "hpm/pipeline/partition.h"
#include "hpm/pipeline/runtime.h"

namespace hpm::pipeline {

struct PipelineStrategyOptions {
  PipelineOptions pipeline;
  PartitionMethod partition = PartitionMethod::kBalanced;
  std::vector<int> boundaries;  // explicit cut points (chunks + 1 of them); overrides `partition`
  int profile_repeats = 3;
};

// All stages as threads of this process; or, given `workers` (one process per stage, e.g. gloo
// under `hpm launch`), stage workers->rank() here. Every process passes the same batches and
// updates its own stage; after synchronize() (which the Trainer calls before it evaluates, saves
// or backs up) every process holds the whole updated model and optimizer state.
std::shared_ptr<distribute::Strategy> make_pipeline(const PipelineStrategyOptions& options,
                                                    comm::CommunicatorPtr workers = nullptr);

// The strategy's view of its pipeline, for reports and `hpm plan`.
struct PipelineReport {
  std::vector<LayerCost> layers;  // profiled (empty for uniform/explicit cuts)
  Partition partition;
  StepStats last_step;
};
// Null until the first step built the pipeline, or when `strategy` is not a pipeline.
const PipelineReport* pipeline_report(const distribute::Strategy& strategy);

}  // namespace hpm::pipeline
