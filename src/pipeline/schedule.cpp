#include "hpm/pipeline/schedule.h"

#include <algorithm>
#include <stdexcept>

namespace hpm::pipeline {

ScheduleKind schedule_from_name(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved" || name == "interleaved_1f1b") return ScheduleKind::kInterleaved;
  if (name == "zb-h1" || name == "zbh1" || name == "zero_bubble") {
    return ScheduleKind::kZeroBubbleH1;
  }
  throw std::invalid_argument("unknown pipeline schedule '" + name +
                              "' (choices: gpipe, 1f1b, interleaved, zb-h1)");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
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

// A ZB-H1 order, found by running the pipeline once with F = B = W = 1 and free messages, each
// device choosing whenever it is idle: a B whose gradient has arrived (the previous device waits
// for it); else the next F if its input has arrived and fewer than K micro-batches sit between F
// and W on the device (the first device's 1F1B bound, so the pipeline's peak stays 1F1B's; later
// devices may hold more than under 1F1B); else the oldest pending W. This reaches the paper's
// bubble (K-1)/(3M + K-1) for K = 2 and for M = K, and lies between it and 1F1B's otherwise (the
// paper's hand-made order does better there). An order one execution followed never deadlocks,
// whatever the real times.
std::vector<std::vector<Action>> zero_bubble_h1(int k, int m) {
  std::vector<std::vector<Action>> out(static_cast<std::size_t>(k));
  // Per device: next F and B to run, W's pending (B done, W not), micro-batches between F and W.
  std::vector<int> next_f(static_cast<std::size_t>(k), 0), next_b(next_f), in_flight(next_f);
  std::vector<std::vector<int>> pending_w(static_cast<std::size_t>(k));
  // When each F / B finished (unit times: integers), -1 until it has.
  std::vector<std::vector<int>> f_done(static_cast<std::size_t>(k),
                                       std::vector<int>(static_cast<std::size_t>(m), -1));
  std::vector<std::vector<int>> b_done(f_done);
  std::vector<int> free_at(static_cast<std::size_t>(k), 0);
  int remaining = 3 * k * m;
  for (int t = 0; remaining > 0; ++t) {
    if (t > 6 * (k + m)) throw std::logic_error("pipeline: the zb-h1 order makes no progress");
    for (int d = 0; d < k; ++d) {
      const auto di = static_cast<std::size_t>(d);
      if (free_at[di] > t) continue;
      auto ready = [&](const std::vector<int>& done, int micro) {
        return done[static_cast<std::size_t>(micro)] >= 0 &&
               done[static_cast<std::size_t>(micro)] <= t;
      };
      const int b = next_b[di];
      const int f = next_f[di];
      const bool b_ready =
          b < m && b < f && (d == k - 1 ? ready(f_done[di], b) : ready(b_done[di + 1], b));
      const bool f_ready = f < m && (d == 0 || ready(f_done[di - 1], f));
      Action a{Action::kForward, -1, d};
      auto run_f = [&] {
        a = {Action::kForward, f, d};
        f_done[di][static_cast<std::size_t>(f)] = t + 1;
        ++next_f[di];
        ++in_flight[di];
      };
      if (b_ready) {
        a = {Action::kBackward, b, d};
        b_done[di][static_cast<std::size_t>(b)] = t + 1;
        ++next_b[di];
        pending_w[di].push_back(b);
      } else if (f_ready && in_flight[di] < k) {
        run_f();
      } else if (!pending_w[di].empty()) {
        a = {Action::kWeight, pending_w[di].front(), d};
        pending_w[di].erase(pending_w[di].begin());
        --in_flight[di];
      } else {
        continue;
      }
      out[di].push_back(a);
      free_at[di] = t + 1;
      --remaining;
    }
  }
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
      case ScheduleKind::kZeroBubbleH1:
        break;
    }
  }
  if (kind == ScheduleKind::kZeroBubbleH1) s.per_device = zero_bubble_h1(devices, micro_batches);
  return s;
}

double theoretical_bubble(const Schedule& s) {
  const double k = s.devices, m = s.micro_batches, v = s.chunks_per_device;
  if (s.splits_backward()) return (k - 1) / (3 * m + k - 1);
  return (k - 1) / (v * m + k - 1);
}

std::vector<int> peak_in_flight(const Schedule& s) {
  std::vector<int> out;
  for (const auto& actions : s.per_device) {
    int live = 0, peak = 0;
    for (const Action& a : actions) {
      if (a.kind == Action::kForward) {
        peak = std::max(peak, ++live);
      } else if (a.kind == (s.splits_backward() ? Action::kWeight : Action::kBackward)) {
        --live;
      }
    }
    out.push_back(peak);
  }
  return out;
}

std::string describe(const Action& a, const Schedule& schedule) {
  std::string s(1, a.kind == Action::kForward ? 'F' : a.kind == Action::kBackward ? 'B' : 'W');
  s += std::to_string(a.micro);
  if (schedule.chunks_per_device > 1) {
    s += '.';
    s += std::to_string(a.chunk / schedule.devices);
  }
  return s;
}

}  // namespace hpm::pipeline
