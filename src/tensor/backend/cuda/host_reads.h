// Reads of a GPU's values to the host that do not drain its stream (host_read.h).
#pragma once
#include <memory>
#include <vector>

#include "hpm/tensor/backend.h"

namespace hpm::cuda {

// Copies `values` (small tensors on one GPU: a step's loss and metrics) into a pinned slot of
// their device, in the compute stream's order, with the words of the calling thread's pending
// index checks behind them; the read's wait() waits for that copy's event only, then judges those
// checks. Values too large for a slot, or a read begun while every slot is held, are copied now.
std::unique_ptr<PendingRead> begin_read(const std::vector<Tensor>& values);

}  // namespace hpm::cuda
