// The backend conformance test (its cases: common/backend_cases.h) on the CPU backend registered
// under a second device type (kPrivateUse), so that the dispatch, the device checks and the cases
// themselves are exercised on machines without a GPU; the CUDA suite (tests/cuda/) runs the same
// cases on cuda:0.
//
// Every op must have a case: OpCoverage fails for an op added to the interface without one.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/backend_cases.h"
#include "common/twin_device.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

using testing::backend_cases::Case;
using testing::backend_cases::cases;
using testing::backend_cases::check;

Device& twin() { return testing::twin_device(); }

TEST(BackendOps, EveryOpMatchesTheCpuOnASecondDeviceType) {
  for (const Case& c : cases()) check(c, twin());
}

// An op added to the Backend interface without a case here fails this test.
TEST(BackendOps, EveryOpHasACase) {
  std::set<int> covered;
  for (const Case& c : cases()) covered.insert(static_cast<int>(c.op));
  for (int op = 0; op < kOps; ++op) {
    EXPECT_TRUE(covered.count(op)) << op_name(static_cast<Op>(op)) << " has no conformance case";
  }
  // And the cases reach their backend: every op was dispatched to the second device type.
  for (const Case& c : cases()) check(c, twin());
  for (int op = 0; op < kOps; ++op) {
    EXPECT_GT(dispatch_count(DeviceType::kPrivateUse, static_cast<Op>(op)), 0u)
        << op_name(static_cast<Op>(op)) << " never reached the second backend";
  }
}

TEST(BackendOps, InputsOnTwoDevicesAreAnErrorNamingBoth) {
  const Tensor a = Tensor::ones({2, 2}), b = Tensor::ones({2, 2}).to(twin());
  try {
    kernels::matmul(a, b);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("matmul"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu (input 1)"), std::string::npos) << m;
    EXPECT_NE(m.find("private:0 (input 2)"), std::string::npos) << m;
  }
  // Logical CPU devices (a pipeline stage's) share the id "cpu": they mix freely.
  Device stage("stage 1");
  EXPECT_EQ(kernels::matmul(a, Tensor::ones({2, 2}).to(stage)).to_vector(),
            (std::vector<float>{2, 2, 2, 2}));
}

// scale_by_'s operands are checked once, for every backend: a one-element F32 scale, an F32 or
// BF16 tensor; anything else is an error naming what it got.
TEST(BackendOps, ScaleByRefusesWhatItCannotScale) {
  Tensor y = Tensor::ones({3});
  EXPECT_THROW(kernels::scale_by_(y, Tensor::ones({2})), std::invalid_argument);
  Tensor ints = Tensor::zeros({3}, DType::I64);
  try {
    kernels::scale_by_(ints, Tensor::scalar(2.0f));
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("I64"), std::string::npos) << e.what();
  }
  kernels::scale_by_(y, Tensor::scalar(2.0f));
  EXPECT_EQ(y.to_vector(), (std::vector<float>{2, 2, 2}));
}

TEST(BackendOps, OutputsAreAllocatedOnTheInputsDevice) {
  // The current device is the CPU; the inputs' device wins, and its allocator counts the output.
  const Tensor x = Tensor::ones({64, 64}).to(twin());
  const std::size_t before = twin().stats().current_bytes;
  const Tensor y = kernels::matmul(x, x);
  EXPECT_EQ(y.device().id(), twin().id());
  EXPECT_EQ(&y.device(), &twin());
  EXPECT_GE(twin().stats().current_bytes, before + 64 * 64 * sizeof(float));
  EXPECT_EQ(y.to(Device::cpu()).to_vector()[0], 64.0f);
  // A reduction is a 0-d tensor on the device; item() brings the value to the host.
  const Tensor s = kernels::sum_all(x);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.device().id(), twin().id());
  EXPECT_EQ(s.item(), 4096.0f);
  EXPECT_EQ(kernels::sum_squares(x).item<double>(), 4096.0);
}

TEST(BackendOps, DevicesNameThemselvesAndStreamsOfTheCpuAreInline) {
  EXPECT_EQ(Device::cpu().id().str(), "cpu");
  EXPECT_EQ(twin().id().str(), "private:0");
  EXPECT_EQ((DeviceId{DeviceType::kCuda, 1}.str()), "cuda:1");
  EXPECT_TRUE(Device::cpu().is_host());
  auto event = Device::cpu().stream().record();
  EXPECT_TRUE(event->ready());
  event->synchronize();
  Device::cpu().stream().wait(*event);
  Device::cpu().stream().synchronize();
  if (!has_backend(DeviceType::kCuda)) {
    try {
      Device gpu(DeviceId{DeviceType::kCuda, 0}, "gpu");
      FAIL() << "a CUDA device without a CUDA backend";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("no backend for device type 'cuda'"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace hpm
