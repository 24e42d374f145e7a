// A discrete-event simulation of a pipeline schedule: each device runs its actions in order; an
// action starts when its device is free and its input has arrived (chunk c's forward needs chunk
// c-1's forward of the same micro-batch, plus the message latency; a backward needs the next
// chunk's backward). With per-chunk times profiled on this machine it predicts the step time and
// bubble the runtime will measure; with made-up times it projects K and M far beyond it.
#pragma once
#include <cstddef>
#include <vector>

#include "hpm/pipeline/schedule.h"

namespace hpm::pipeline {

struct ChunkCost {
  double forward_s = 0;              // one micro-batch's forward through the chunk
  double backward_s = 0;             // and its whole backward (B and W)
  std::size_t activation_bytes = 0;  // held from a micro-batch's forward until its backward
  std::size_t resident_bytes = 0;    // parameters, gradients: held all the time
  double weight_s = 0;               // the weight-gradient part of backward_s (W), where known
};

struct SimulatedAction {
  Action action;
  double start_s = 0, end_s = 0;
};

struct Simulation {
  double step_s = 0;                    // the last action's end
  double bubble = 0;                    // 1 - busy / (devices * step)
  std::vector<double> busy_s;           // per device
  std::vector<std::size_t> peak_bytes;  // per device: resident + most activations at once
  std::vector<std::vector<SimulatedAction>> timeline;  // per device, in order
};

// `costs` has one entry per chunk (schedule.chunks()); a schedule that splits backwards runs B in
// backward_s - weight_s and W in weight_s, and holds activations until W. `message_s` is the time
// from a chunk's end to the next chunk's input being usable on another device (0 on the same
// device). Throws std::logic_error if the schedule deadlocks (an action waits for one that can
// never run).
Simulation simulate(const Schedule& schedule, const std::vector<ChunkCost>& costs,
                    double message_s = 0);

}  // namespace hpm::pipeline
