// The GPU the CUDA suite runs on: cuda:0, or the reason there is none (a build without
// HPM_CUDA, no driver, no device), which every test of the suite reports as its skip.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "hpm/tensor/backend.h"

namespace hpm::testing {

struct CudaAvailability {
  Device* device = nullptr;
  std::string reason;
};

inline const CudaAvailability& cuda_availability() {
  static const CudaAvailability a = [] {
    CudaAvailability r;
    if (!has_backend(DeviceType::kCuda)) {
      r.reason = "this build has no CUDA backend (configured with HPM_CUDA=OFF or without nvcc)";
      return r;
    }
    try {
      r.device = new Device(DeviceId{DeviceType::kCuda, 0}, "cuda:0");  // lives for the process
    } catch (const std::exception& e) {
      r.reason = e.what();
    }
    return r;
  }();
  return a;
}

}  // namespace hpm::testing

// Declares `Device& name` (cuda:0), or skips the test saying why there is no GPU.
#define HPM_CUDA_DEVICE_OR_SKIP(name)                                         \
  if (::hpm::testing::cuda_availability().device == nullptr) {                \
    GTEST_SKIP() << "no GPU: " << ::hpm::testing::cuda_availability().reason; \
  }                                                                           \
  ::hpm::Device& name = *::hpm::testing::cuda_availability().device
