#include "hpm/pipeline/schedule.h"

#include <algorithm>
#include <stdexcept>

namespace hpm::pipeline {

ScheduleKind schedule_from_name(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved" || name == "interleaved_1f1b") return ScheduleKind::kInterleaved;
  throw std::invalid_argument("unknown pipeline schedule '" + name +
                              "' (choices: gpipe, 1f1b, interleaved)");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
  }
  return "?";
}

namespace {

std::vector<Action> gpipe(int d, int m) {
  std::vector<Action> out;
  for (int i = 0; i < m; ++i) out.push_back({Action::kForward, i, d});
  // Backwards in reverse: the last micro-batch forwarded is the first whose gradient arrives.
  for (int i = m - 1; i >= 0; --i) out.push_back({Action::kBackward, i, d});
  return out;
}

std::vector<Action> one_f_one_b(int d, int k, int m) {
  std::vector<Action> out;
  const int warmup = std::min(k - d - 1, m);
  int next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) out.push_back({Action::kForward, next_f, d});
  while (next_f < m) {
    out.push_back({Action::kForward, next_f++, d});
    out.push_back({Action::kBackward, next_b++, d});
  }
  while (next_b < m) out.push_back({Action::kBackward, next_b++, d});
  return out;
}

// Megatron-LM's order: micro-batches advance in groups of K; within a group each of the device's
// v chunks takes the group in turn (forward: chunk 0 first; backward: the last chunk first).
std::vector<Action> interleaved(int d, int k, int m, int v) {
  const int total = m * v;
  auto action = [&](Action::Kind kind, int step) {
    const int in_group = step % (k * v);
    int local = in_group / k;
    if (kind == Action::kBackward) local = v - 1 - local;
    const int micro = (step / (k * v)) * k + step % k;
    return Action{kind, micro, local * k + d};
  };
  const int warmup = m == k ? total : std::min(total, (k - d - 1) * 2 + (v - 1) * k);
  std::vector<Action> out;
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(action(Action::kForward, f));
  while (f < total) {
    out.push_back(action(Action::kForward, f++));
    out.push_back(action(Action::kBackward, b++));
  }
  while (b < total) out.push_back(action(Action::kBackward, b++));
  return out;
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int devices, int micro_batches, int chunks_per_device) {
  if (devices < 1) throw std::invalid_argument("pipeline: stages must be >= 1");
  if (micro_batches < 1) throw std::invalid_argument("pipeline: micro_batches must be >= 1");
  Schedule s{kind, devices, micro_batches, 1, {}};
  if (kind == ScheduleKind::kInterleaved) {
    if (chunks_per_device < 2) {
      throw std::invalid_argument(
          "pipeline: the interleaved schedule needs at least 2 chunks per stage, got " +
          std::to_string(chunks_per_device));
    }
    if (micro_batches % devices != 0) {
      throw std::invalid_argument("pipeline: the interleaved schedule needs micro_batches (" +
                                  std::to_string(micro_batches) + ") to be a multiple of stages (" +
                                  std::to_string(devices) + ")");
    }
    s.chunks_per_device = chunks_per_device;
  } else if (chunks_per_device != 1) {
    throw std::invalid_argument(std::string("pipeline: only the interleaved schedule puts several "
                                            "chunks on a stage, not ") +
                                schedule_name(kind));
  }
  for (int d = 0; d < devices; ++d) {
    switch (kind) {
      case ScheduleKind::kGPipe:
        s.per_device.push_back(gpipe(d, micro_batches));
        break;
      case ScheduleKind::kOneFOneB:
        s.per_device.push_back(one_f_one_b(d, devices, micro_batches));
        break;
      case ScheduleKind::kInterleaved:
        s.per_device.push_back(interleaved(d, devices, micro_batches, chunks_per_device));
        break;
    }
  }
  return s;
}

double theoretical_bubble(const Schedule& s) {
  const double k = s.devices, m = s.micro_batches, v = s.chunks_per_device;
  return (k - 1) / (v * m + k - 1);
}

std::vector<int> peak_in_flight(const Schedule& s) {
  std::vector<int> out;
  for (const auto& actions : s.per_device) {
    int live = 0, peak = 0;
    for (const Action& a : actions) {
      live += a.kind == Action::kForward ? 1 : -1;
      peak = std::max(peak, live);
    }
    out.push_back(peak);
  }
  return out;
}

std::string describe(const Action& a, const Schedule& schedule) {
  std::string s(1, a.kind == Action::kForward ? 'F' : 'B');
  s += std::to_string(a.micro);
  if (schedule.chunks_per_device > 1) {
    s += '.';
    s += std::to_string(a.chunk / schedule.devices);
  }
  return s;
}

}  // namespace hpm::pipeline
