#include "hpm/pipeline/simulator.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

namespace hpm::pipeline {

Simulation simulate(const Schedule& s, const std::vector<ChunkCost>& costs, double message_s) {
  if (static_cast<int>(costs.size()) != s.chunks()) {
    throw std::invalid_argument("simulate: " + std::to_string(costs.size()) +
                                " chunk costs for a schedule of " + std::to_string(s.chunks()) +
                                " chunks");
  }
  const int k = s.devices;
  const int last_chunk = s.chunks() - 1;
  // When each (kind, micro, chunk) finished; an action's input is ready at its producer's end
  // plus the message time when the producer sits on another device.
  std::map<std::tuple<int, int, int>, double> done;
  auto key = [](Action::Kind kind, int micro, int chunk) {
    return std::make_tuple(static_cast<int>(kind), micro, chunk);
  };
  auto input_ready = [&](const Action& a, double* t) {
    int producer_chunk = -1;
    Action::Kind producer_kind = a.kind;
    if (a.kind == Action::kWeight) {
      producer_chunk = a.chunk;  // its own B
      producer_kind = Action::kBackward;
    } else if (a.kind == Action::kForward) {
      if (a.chunk == 0) return *t = 0, true;
      producer_chunk = a.chunk - 1;
    } else if (a.chunk == last_chunk) {
      producer_chunk = a.chunk;  // the loss: this chunk's own forward
      producer_kind = Action::kForward;
    } else {
      producer_chunk = a.chunk + 1;
    }
    auto it = done.find(key(producer_kind, a.micro, producer_chunk));
    if (it == done.end()) return false;
    *t = it->second + (s.device_of(producer_chunk) == s.device_of(a.chunk) ? 0.0 : message_s);
    return true;
  };

  Simulation sim;
  sim.busy_s.assign(static_cast<std::size_t>(k), 0.0);
  sim.timeline.resize(static_cast<std::size_t>(k));
  std::vector<std::size_t> next(static_cast<std::size_t>(k), 0);
  std::vector<double> free_at(static_cast<std::size_t>(k), 0.0);
  std::size_t remaining = 0;
  for (const auto& list : s.per_device) remaining += list.size();
  while (remaining > 0) {
    // Run, among the devices whose next action has its input, the one that can start earliest:
    // events happen in time order, as they would on real devices.
    int best = -1;
    double best_start = 0;
    for (int d = 0; d < k; ++d) {
      const auto& list = s.per_device[static_cast<std::size_t>(d)];
      if (next[static_cast<std::size_t>(d)] >= list.size()) continue;
      double ready = 0;
      if (!input_ready(list[next[static_cast<std::size_t>(d)]], &ready)) continue;
      const double start = std::max(ready, free_at[static_cast<std::size_t>(d)]);
      if (best < 0 || start < best_start) best = d, best_start = start;
    }
    if (best < 0) {
      std::string waiting;
      for (int d = 0; d < k; ++d) {
        const auto& list = s.per_device[static_cast<std::size_t>(d)];
        if (next[static_cast<std::size_t>(d)] < list.size()) {
          waiting += " device " + std::to_string(d) + " at " +
                     describe(list[next[static_cast<std::size_t>(d)]], s) + ";";
        }
      }
      throw std::logic_error("pipeline schedule deadlocks:" + waiting);
    }
    const auto bd = static_cast<std::size_t>(best);
    const Action a = s.per_device[bd][next[bd]++];
    const ChunkCost& c = costs[static_cast<std::size_t>(a.chunk)];
    const double dur = a.kind == Action::kForward  ? c.forward_s
                       : a.kind == Action::kWeight ? c.weight_s
                       : s.splits_backward()       ? c.backward_s - c.weight_s
                                                   : c.backward_s;
    const double end = best_start + dur;
    done[key(a.kind, a.micro, a.chunk)] = end;
    free_at[bd] = end;
    sim.busy_s[bd] += dur;
    sim.timeline[bd].push_back({a, best_start, end});
    sim.step_s = std::max(sim.step_s, end);
    --remaining;
  }
  double busy = 0;
  for (double b : sim.busy_s) busy += b;
  sim.bubble = sim.step_s > 0 ? 1.0 - busy / (static_cast<double>(k) * sim.step_s) : 0.0;

  for (int d = 0; d < k; ++d) {
    std::size_t resident = 0;
    for (int c = d; c <= last_chunk; c += k)
      resident += costs[static_cast<std::size_t>(c)].resident_bytes;
    std::size_t live = 0, peak = 0;
    for (const Action& a : s.per_device[static_cast<std::size_t>(d)]) {
      const std::size_t bytes = costs[static_cast<std::size_t>(a.chunk)].activation_bytes;
      if (a.kind == Action::kForward) {
        live += bytes;
        peak = std::max(peak, live);
      } else if (a.kind == (s.splits_backward() ? Action::kWeight : Action::kBackward)) {
        live -= bytes;
      }
    }
    sim.peak_bytes.push_back(resident + peak);
  }
  return sim;
}

}  // namespace hpm::pipeline
