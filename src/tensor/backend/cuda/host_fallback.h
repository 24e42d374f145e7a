// Ops without a CUDA kernel yet run on the CPU backend over host copies of their inputs, their
// outputs copied back: correct and complete, slow (two transfers and a synchronization each).
// Which ops take this path is listed in cuda_backend.cpp and docs/backends.md; the conformance
// test holds them to the CPU's numbers like every other op.
#pragma once
#include "hpm/tensor/backend.h"

namespace hpm::cuda {

class HostFallback {
 public:
  // Captures the op's device (the current one, as the dispatch made it) and makes the CPU
  // current, so that the CPU backend allocates on the host.
  HostFallback() : device_(Device::current()), guard_(Device::cpu()) {}
  Backend& cpu() const { return backend(DeviceType::kCpu); }
  // An input's host copy (undefined stays undefined).
  static Tensor in(const Tensor& t) { return t.defined() ? t.to(Device::cpu()) : t; }
  // A result brought back to the op's device.
  Tensor out(const Tensor& t) const { return t.defined() ? t.to(device_) : t; }
  // A tensor updated in place on the host, written back into its device original.
  static void write_back(Tensor& device_tensor, const Tensor& host) {
    if (device_tensor.defined()) device_tensor.copy_(host);
  }
  // An optional output (a gradient pointer): the host result, moved to the device.
  void out_ptr(Tensor* dst, const Tensor& host) const {
    if (dst != nullptr) *dst = out(host);
  }

 private:
  Device& device_;
  DeviceGuard guard_;
};

}  // namespace hpm::cuda
