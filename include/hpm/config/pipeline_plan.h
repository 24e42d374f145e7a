// The pipeline a config's [pipeline] section asks for, before running it (`hpm plan`): each layer
// profiled on one micro-batch of the config's own training data, the model cut as [pipeline]
// partition says, the schedule simulated over the profiled chunk times.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "hpm/config/config.h"
#include "hpm/nn/containers.h"
#include "hpm/pipeline/partition.h"
#include "hpm/pipeline/schedule.h"
#include "hpm/pipeline/simulator.h"

namespace hpm::config {

struct PipelinePlan {
  std::shared_ptr<nn::Sequential> model;
  std::int64_t batch_rows = 0, micro_batch_rows = 0;
  std::vector<pipeline::LayerCost> layers;  // profiled, one micro-batch each
  pipeline::Partition partition;
  pipeline::Schedule schedule;
  pipeline::Simulation simulation;
  double one_device_step_s = 0;  // the same micro-batches, one after another on one device
};

// `message_s`: the time for an activation to reach the next stage. Seeds with [train] seed; the
// caller sets the kernel threads. A ConfigError when the data yields no batch.
PipelinePlan plan_pipeline(const Config& cfg, double message_s = 0);

// The plan as `hpm plan --report` writes it: the partition, each stage's busy time and peak
// memory, the predictions, every layer's profile.
nlohmann::json pipeline_plan_report(const Config& cfg, const PipelinePlan& plan);

}  // namespace hpm::config
