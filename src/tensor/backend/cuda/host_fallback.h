// An op run by the CPU backend over host copies of its inputs, its output copied back: dropout's
// mask, which the host's generator draws so that a GPU run drops the units the CPU's does (the
// one op on this path; cuda_backend.cpp and docs/backends.md name it). Correct, and a transfer
// and a synchronization each.
#pragma once
#include "hpm/tensor/backend.h"

namespace hpm::cuda {

class HostFallback {
 public:
  // Captures the op's device (the current one, as the dispatch made it) and makes the CPU
  // current, so that the CPU backend allocates on the host.
  HostFallback() : device_(Device::current()), guard_(Device::cpu()) {}
  Backend& cpu() const { return backend(DeviceType::kCpu); }
  // A result brought back to the op's device.
  Tensor out(const Tensor& t) const { return t.defined() ? t.to(device_) : t; }

 private:
  Device& device_;
  DeviceGuard guard_;
};

}  // namespace hpm::cuda
