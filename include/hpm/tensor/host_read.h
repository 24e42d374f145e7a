// Device values read to the host without draining the device. A training step's loss is known
// once its forward has run, but the step goes on to issue its backward and its update: a read
// begun right after the forward and waited for after the update waits only for the forward, and
// on a GPU the device stays busy with the backward meanwhile, where a plain item() at that point
// would wait for everything issued, and leave the device idle while the host issues the next step.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

#include "hpm/tensor/backend.h"
#include "hpm/tensor/tensor.h"

namespace hpm {

class HostRead {
 public:
  HostRead() = default;
  // Begins reading `values` (defined tensors on one device; none: nothing to read) as they are
  // at this point of the device's work: ops issued later, in-place ones included, do not change
  // what is read. Throws std::invalid_argument for tensors on two devices.
  explicit HostRead(const std::vector<Tensor>& values);
  HostRead(HostRead&&) noexcept;
  HostRead& operator=(HostRead&&) noexcept;
  HostRead(const HostRead&) = delete;
  HostRead& operator=(const HostRead&) = delete;
  ~HostRead();

  bool empty() const { return count_ == 0; }
  // The values as CPU tensors, in order. The first call waits for the device's work issued before
  // the read began (counted by host_waits_on_this_thread only when nothing was issued after it,
  // so that the wait drained the device) and throws what that work owes the host (a GPU's failed
  // index check: std::out_of_range); later calls return the same tensors (or throw the same).
  const std::vector<Tensor>& wait();
  // Element `at` of value i (F32, F64, I64 or I32) as a double, after wait() (which it calls): read
  // from the host copy, not counted as a wait.
  double value(std::size_t i, std::int64_t at = 0);

 private:
  std::unique_ptr<PendingRead> pending_;
  std::vector<Tensor> host_;
  std::size_t count_ = 0;
  std::uint64_t ops_at_begin_ = 0;
  std::exception_ptr failure_;
};

}  // namespace hpm
