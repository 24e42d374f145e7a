#include "hpm/config/pipeline_plan.h"

#include "hpm/config/datasets.h"
#include "hpm/tensor/random.h"

namespace hpm::config {

PipelinePlan plan_pipeline(const Config& cfg, double message_s) {
  const PipelineSection& p = cfg.pipeline;
  manual_seed(cfg.seed);
  PipelinePlan plan;
  plan.model = nn::as_sequential(build_model(cfg));
  plan.schedule = pipeline::make_schedule(pipeline::schedule_from_name(p.schedule), p.stages,
                                          p.micro_batches, p.chunks_per_stage);
  // One micro-batch of the config's own data, as training would see it.
  data::Element first;
  {
    std::int64_t examples = 0;
    std::unique_ptr<data::Iterator> it = training_pipeline(cfg, &examples).make_iterator(0);
    if (!it->next(first)) throw ConfigError(cfg.path + ": the training data yields no batch");
  }
  const Tensor& x = first.at(0);
  plan.batch_rows = x.size(0);
  plan.micro_batch_rows = (x.size(0) + p.micro_batches - 1) / p.micro_batches;
  plan.layers =
      pipeline::profile_layers(*plan.model, x.narrow(0, plan.micro_batch_rows), p.profile_repeats);
  plan.partition = pipeline::partition(plan.layers, plan.schedule.chunks(),
                                       pipeline::partition_from_name(p.partition));
  const std::vector<pipeline::ChunkCost> costs =
      pipeline::chunk_costs(plan.layers, plan.partition.boundaries);
  plan.simulation = pipeline::simulate(plan.schedule, costs, message_s);
  for (const auto& c : costs)
    plan.one_device_step_s += (c.forward_s + c.backward_s) * p.micro_batches;
  return plan;
}

nlohmann::json pipeline_plan_report(const Config& cfg, const PipelinePlan& plan) {
  const PipelineSection& p = cfg.pipeline;
  const pipeline::Simulation& sim = plan.simulation;
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t d = 0; d < sim.busy_s.size(); ++d)
    stages.push_back({{"busy_s", sim.busy_s[d]}, {"peak_bytes", sim.peak_bytes[d]}});
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : plan.layers) {
    layers.push_back({{"name", l.name},
                      {"forward_s", l.forward_s},
                      {"backward_s", l.backward_s},
                      {"weight_s", l.weight_s},
                      {"parameter_bytes", l.parameter_bytes},
                      {"activation_bytes", l.activation_bytes}});
  }
  return {{"schedule", p.schedule},
          {"stages", p.stages},
          {"micro_batches", p.micro_batches},
          {"chunks_per_stage", p.chunks_per_stage},
          {"partition", p.partition},
          {"boundaries", plan.partition.boundaries},
          {"imbalance", plan.partition.imbalance},
          {"predicted_step_s", sim.step_s},
          {"one_device_step_s", plan.one_device_step_s},
          {"predicted_bubble", sim.bubble},
          {"formula_bubble", pipeline::theoretical_bubble(plan.schedule)},
          {"stage", stages},
          {"layers", layers}};
}

}  // namespace hpm::config
