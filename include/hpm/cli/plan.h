// `hpm plan CONFIG`: the pipeline a config's [pipeline] section asks for, before running it. Each
// layer is profiled on one micro-batch of the config's data, the model is cut as [pipeline]
// partition says, and the schedule is simulated over the profiled chunk times: the partition, each
// stage's peak memory, the predicted step time and bubble. `--project` runs the same simulator for
// pipelines far deeper than this machine (K up to 64).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hpm/distribute/strategy.h"

namespace CLI {
class App;
}

namespace hpm::cli {

struct PlanCommandOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string report;
  double message_us = 0;  // time for an activation to reach the next stage
  bool project = false;
  int threads = 0;
};

CLI::App* add_plan_command(CLI::App& app, PlanCommandOptions& options);
int run_plan(const PlanCommandOptions& options);

// The pipeline strategy's partition and last step (bubble, per-stage peak memory) for hpm train's
// report; null when `strategy` is not a pipeline.
nlohmann::json pipeline_report_json(const distribute::Strategy* strategy);

}  // namespace hpm::cli
