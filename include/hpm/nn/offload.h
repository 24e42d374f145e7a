// Offload ("memory swap", vDNN): activations a Sequential saved for backward leave the training
// Device for host memory after forward, and a prefetching thread brings them back just ahead of
// the backward that needs them, so the copies overlap compute.
//
//   auto model = nn::with_offload(build_model(), {.threshold_bytes = 64 << 10});
//
// How: during forward, an AllocationLog records the storages each unit (a layer, or a fused
// Conv2d+ReLU) allocates. After unit j's forward, every recorded storage still alive (so held by
// the autograd graph: saved for backward) and at least `threshold_bytes` large moves to
// Device::host(), except unit j's output, which the next unit reads; that one moves after the next
// unit. The last unit keeps its storages, since backward starts there. An identity node at each
// unit's output runs in backward just before that unit's own backward: it waits for the unit's
// storages to be back (on the Device they came from) and asks the prefetch thread for the previous
// unit's, whose copy then runs while this unit's backward computes. Data only moves, so results
// are bit-identical; a prefetch that does not fit the budget fails backward with OutOfMemoryError.
//
// The moves to host run on the forward's thread (they free device memory at once, which is what
// lowers the peak); the moves back run on the prefetch thread, or on backward's own thread when it
// needs a unit whose copy the prefetch thread has not started yet (a busy machine can leave that
// thread unscheduled for milliseconds; waiting would only add the latency).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "hpm/nn/module.h"
#include "hpm/tensor/device.h"

namespace hpm::nn {

struct OffloadOptions {
  std::size_t threshold_bytes = 64 << 10;  // smaller storages stay on the device
};

struct OffloadStats {
  std::uint64_t storages_offloaded = 0;  // over all steps
  std::uint64_t bytes_offloaded = 0;
  std::uint64_t bytes_prefetched = 0;
  double offload_seconds = 0;   // forward's copies to host
  double prefetch_seconds = 0;  // the prefetch thread's copies back
  double wait_seconds = 0;      // backward waited for a prefetch (copy time overlap did not hide)
  // Prefetches backward found not yet started and copied itself (the thread was not scheduled in
  // time); their time is part of wait_seconds.
  std::uint64_t copied_by_backward = 0;
};

class OffloadedSequential final : public Sequential {
 public:
  // Holds `model`'s layers under the same names (same state_dict). Starts the prefetch thread.
  OffloadedSequential(const Sequential& model, OffloadOptions options);
  ~OffloadedSequential() override;

  // Offloads only when recording gradients in training mode; otherwise Sequential::forward.
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  OffloadStats stats() const;

  struct Prefetcher;

 private:
  OffloadOptions options_;
  std::vector<std::pair<std::size_t, std::size_t>> units_;
  std::vector<std::shared_ptr<Sequential>> unit_modules_;
  std::shared_ptr<Prefetcher> prefetcher_;
};

std::shared_ptr<OffloadedSequential> with_offload(std::shared_ptr<Sequential> model,
                                                  OffloadOptions options = {});

}  // namespace hpm::nn
