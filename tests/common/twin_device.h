// A second device type for tests: the CPU backend registered under DeviceType::kPrivateUse, and
// one device of it ("private:0"). Ops on its tensors dispatch through the Backend registry as a
// GPU's would, so what mixes devices or bypasses dispatch shows up on a machine without a GPU.
#pragma once
#include "hpm/tensor/backend.h"

namespace hpm::testing {

inline Device& twin_device() {
  static Device* device = [] {
    if (!has_backend(DeviceType::kPrivateUse)) {
      register_backend(make_cpu_backend(DeviceType::kPrivateUse));
    }
    return new Device(DeviceId{DeviceType::kPrivateUse, 0}, "twin");
  }();
  return *device;
}

}  // namespace hpm::testing
