// Pipeline schedules: for each of K devices, the order in which it runs the forward (F) and
// backward (B) passes of M micro-batches. A model is cut into K * v chunks; device d holds chunks
// d, d + K, d + 2K, ... (v = 1 but for the interleaved schedule), and chunk c's output is chunk
// c + 1's input. A schedule is only an order: the runtime (runtime.h) and the simulator
// (simulator.h) both execute it, so what is simulated is what runs.
//
//   GPipe          all forwards, then all backwards (Huang et al. 2019). Activations of all M
//                  micro-batches are alive at once; bubble (K-1)/(M+K-1).
//   1F1B           PipeDream-Flush (Narayanan et al. 2021): K-d-1 warm-up forwards on device d,
//                  then one forward, one backward; the same bubble as GPipe, but at most K
//                  micro-batches' activations alive per device.
//   interleaved    Megatron-LM's interleaved 1F1B: v chunks per device, the bubble shrinks by v:
//                  (K-1)/(v*M + K-1) of the step, at the cost of v times more messages.
//   zb-h1          Zero Bubble H1 (Qi et al. 2023): each backward splits into B (the input
//                  gradient, which the previous device waits for) and W (the weight gradient,
//                  which nobody waits for); W passes fill the idle time 1F1B leaves, with 1F1B's
//                  memory bound (at most K - d micro-batches between F and W on device d). With
//                  F = B = W the bubble is (K-1)/(3M + K-1), a third of 1F1B's.
#pragma once
#include <string>
#include <vector>

namespace hpm::pipeline {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kZeroBubbleH1 };

// "gpipe", "1f1b", "interleaved", "zb-h1"; throws std::invalid_argument listing the choices.
ScheduleKind schedule_from_name(const std::string& name);
const char* schedule_name(ScheduleKind kind);

struct Action {
  // kBackward is the whole backward, or only its input gradient where a kWeight follows.
  enum Kind { kForward, kBackward, kWeight } kind;
  int micro = 0;  // micro-batch
  int chunk = 0;  // model chunk (0 .. K*v - 1), held by device chunk % K
  bool operator==(const Action&) const = default;
};

struct Schedule {
  ScheduleKind kind;
  int devices = 1;                              // K
  int micro_batches = 1;                        // M
  int chunks_per_device = 1;                    // v
  std::vector<std::vector<Action>> per_device;  // K lists of 2 (3 if split) * M * v actions
  int chunks() const { return devices * chunks_per_device; }
  // Whether backwards are split into B and W actions.
  bool splits_backward() const { return kind == ScheduleKind::kZeroBubbleH1; }
  int device_of(int chunk) const { return chunk % devices; }
};

// Throws std::invalid_argument when K, M or v make no sense for the kind (the interleaved schedule
// needs M to be a multiple of K, and v >= 2 to differ from 1F1B).
Schedule make_schedule(ScheduleKind kind, int devices, int micro_batches,
                       int chunks_per_device = 1);

// The idle share of a step when F and B (and W) take the same time everywhere and messages are
// free: (K-1)/(M+K-1) for GPipe and 1F1B, (K-1)/(v*M + K-1) interleaved, (K-1)/(3M + K-1) ZB-H1.
double theoretical_bubble(const Schedule& schedule);

// Most micro-batches whose activations one device holds at once (forwarded, not yet backwarded,
// or for ZB-H1 not yet through W), counted in chunk-micro-batches: M for GPipe, <= K for 1F1B.
std::vector<int> peak_in_flight(const Schedule& schedule);

// "F3", "B3" or "W3"; "F3.1" for the device's second chunk under the interleaved schedule.
std::string describe(const Action& a, const Schedule& schedule);

}  // namespace hpm::pipeline
