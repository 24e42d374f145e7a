// Pipelines far deeper than this machine, projected: a model's profiled time spread evenly over K
// stages (v chunks each), every schedule simulated at several micro-batch counts, so a table shows
// what the schedule alone does to deeper pipelines (`hpm plan --project`). Messages are free.
#pragma once
#include <vector>

#include "hpm/pipeline/schedule.h"

namespace hpm::pipeline {

struct ProjectedSchedule {
  int stages = 0, micro_batches = 0, chunks_per_stage = 1;
  ScheduleKind kind = ScheduleKind::kGPipe;
  double step_over_ideal = 0;  // the simulated step over M * (forward + backward) / K
  double bubble = 0;           // simulated
  double formula_bubble = 0;   // theoretical_bubble of the schedule
};

// K in 2, 4, ..., 64; M in K, 4K, 8K; GPipe, 1F1B, interleaved (v = 2) and ZB-H1 for each, in
// that order. The totals are the whole model's for one mini-batch.
std::vector<ProjectedSchedule> project_schedules(double forward_s, double backward_s,
                                                 double weight_s);

}  // namespace hpm::pipeline
