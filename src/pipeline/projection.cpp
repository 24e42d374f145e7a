#include "hpm/pipeline/projection.h"

#include <utility>

#include "hpm/pipeline/simulator.h"

namespace hpm::pipeline {

std::vector<ProjectedSchedule> project_schedules(double forward_s, double backward_s,
                                                 double weight_s) {
  const std::pair<ScheduleKind, int> kinds[] = {{ScheduleKind::kGPipe, 1},
                                                {ScheduleKind::kOneFOneB, 1},
                                                {ScheduleKind::kInterleaved, 2},
                                                {ScheduleKind::kZeroBubbleH1, 1}};
  std::vector<ProjectedSchedule> out;
  for (const int k : {2, 4, 8, 16, 32, 64}) {
    for (const int m : {k, 4 * k, 8 * k}) {
      for (const auto& [kind, v] : kinds) {
        const Schedule s = make_schedule(kind, k, m, v);
        // Each chunk holds 1/(K v) of the model; a micro-batch's share is what the simulator
        // times, so the pipeline's ideal step is the unsplit step divided by K.
        ChunkCost cost;
        cost.forward_s = forward_s / (k * v);
        cost.backward_s = backward_s / (k * v);
        cost.weight_s = weight_s / (k * v);
        const Simulation sim =
            simulate(s, std::vector<ChunkCost>(static_cast<std::size_t>(k * v), cost));
        const double ideal = m * (forward_s + backward_s) / k;
        out.push_back({k, m, v, kind, sim.step_s / ideal, sim.bubble, theoretical_bubble(s)});
      }
    }
  }
  return out;
}

}  // namespace hpm::pipeline
