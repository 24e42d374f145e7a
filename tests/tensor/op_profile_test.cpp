// The op profile: what it records (outermost ops only, per op, function and dtype, copies between
// host and device), when (only while on), and its table. Times are only checked to be what the
// events say, never against a bound.
#include "hpm/tensor/op_profile.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/twin_device.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

const op_profile::Row* find(const std::vector<op_profile::Row>& rows, const std::string& name,
                            const std::string& detail = "") {
  for (const auto& r : rows)
    if (r.name == name && r.detail == detail) return &r;
  return nullptr;
}

struct Profiled {
  Profiled() {
    op_profile::reset();
    op_profile::start();
  }
  ~Profiled() { op_profile::stop(); }
};

TEST(OpProfile, CountsEachOpByFunctionAndDtypeWhileOn) {
  Generator gen(1);
  const Tensor a = Tensor::randn({8, 8}, gen), b = Tensor::randn({8, 8}, gen);
  kernels::matmul(a, b, false, false);  // before start: not recorded
  std::vector<op_profile::Row> rows;
  {
    const Profiled on;
    for (int i = 0; i < 3; ++i) kernels::matmul(a, b, false, false);
    kernels::binary(kernels::BinaryOp::Mul, a, b);
    kernels::unary(kernels::UnaryOp::Gelu, a);
    kernels::to_bf16(a);
    op_profile::stop();
    kernels::matmul(a, b, false, false);  // after stop: not recorded
    rows = op_profile::rows();
  }
  const auto* mm = find(rows, "matmul", "8x8x8");  // a product's detail: its M x N x K
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->calls, 3);
  EXPECT_EQ(mm->dtype, "F32");
  EXPECT_EQ(mm->device, "cpu");
  EXPECT_GE(mm->seconds, 0.0);
  EXPECT_GE(mm->host_seconds, 0.0);
  ASSERT_NE(find(rows, "binary", "mul"), nullptr);
  EXPECT_EQ(find(rows, "binary", "mul")->calls, 1);
  ASSERT_NE(find(rows, "unary", "gelu"), nullptr);
  ASSERT_NE(find(rows, "to_bf16"), nullptr);
  EXPECT_EQ(rows.size(), 4u);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end(),
                             [](const auto& x, const auto& y) { return x.seconds > y.seconds; }));
  op_profile::reset();
  EXPECT_TRUE(op_profile::rows().empty());
}

TEST(OpProfile, AnOpInsideAnotherCountsOnce) {
  const Profiled on;
  {
    const op_profile::Scope outer("outer", DType::BF16, Device::cpu());
    const op_profile::Scope inner("inner", DType::F32, Device::cpu());
  }
  const auto rows = op_profile::rows();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].name, "outer");
  EXPECT_EQ(rows[0].dtype, "BF16");
  EXPECT_EQ(rows[0].calls, 1);
}

TEST(OpProfile, TimesOpsAndCopiesOnAnotherDeviceType) {
  Device& twin = testing::twin_device();
  Generator gen(2);
  const Tensor a = Tensor::randn({4, 4}, gen);
  const Profiled on;
  const Tensor on_twin = a.to(twin);
  kernels::matmul(on_twin, on_twin, false, true);
  const auto rows = op_profile::rows();
  const auto* mm = find(rows, "matmul", "4x4x4");
  ASSERT_NE(mm, nullptr);
  EXPECT_EQ(mm->device, "private");
  // The twin is host memory to the CPU backend, so a copy to it is a host copy: not an op.
  EXPECT_EQ(find(rows, "copy to device"), nullptr);
}

// A product's row names its M x N x K: each shape of a step's products its own row.
TEST(OpProfile, ProductsAreRecordedByShape) {
  op_profile::reset();
  op_profile::start();
  Generator gen(3);
  const Tensor a = Tensor::randn({6, 4}, gen), b = Tensor::randn({5, 4}, gen);
  kernels::matmul(a, b, false, true);
  kernels::matmul(a, b, false, true);
  kernels::linear(a, b, Tensor());
  Tensor dw = Tensor::zeros({5, 4});
  kernels::linear_param_grads_(dw, Tensor::randn({6, 5}, gen), a, false);
  op_profile::stop();
  const auto rows = op_profile::rows();
  const auto row = [&](const char* name) {
    for (const auto& r : rows)
      if (r.name == name) return r;
    return op_profile::Row{};
  };
  EXPECT_EQ(row("matmul").detail, "6x5x4");
  EXPECT_EQ(row("matmul").calls, 2);
  EXPECT_EQ(row("linear").detail, "6x5x4");
  EXPECT_EQ(row("linear_param_grads_").detail, "5x4x6");
  op_profile::reset();
}

TEST(OpProfile, TableGivesPerStepTimesSharesAndTheRest) {
  std::vector<op_profile::Row> rows(2);
  rows[0] = {"matmul", "", "bf16", "cuda", 40, 0.030};
  rows[1] = {"binary", "add", "f32", "cuda", 100, 0.010};
  rows[0].host_seconds = 0.007;
  rows[1].host_seconds = 0.002;
  const std::string t = op_profile::table(rows, 0.050, 10);
  EXPECT_NE(t.find("0.700"), std::string::npos) << t;  // matmul's host time per step
  EXPECT_NE(t.find("0.900"), std::string::npos) << t;  // the host inside ops, per step
  EXPECT_NE(t.find("matmul"), std::string::npos) << t;
  EXPECT_NE(t.find("3.000"), std::string::npos) << t;  // 30 ms over 10 steps
  EXPECT_NE(t.find("60.0%"), std::string::npos) << t;  // of 50 ms
  EXPECT_NE(t.find("10.0"), std::string::npos) << t;   // binary's calls per step
  EXPECT_NE(t.find("(outside ops)"), std::string::npos) << t;
  EXPECT_NE(t.find("1.000"), std::string::npos) << t;  // 10 ms outside ops, per step
  EXPECT_NE(t.find("20.0%"), std::string::npos) << t;
  // Ops of several threads at once add up past the step: said, not a negative remainder.
  const std::string overlapped = op_profile::table(rows, 0.020, 10);
  EXPECT_NE(overlapped.find("overlapped"), std::string::npos) << overlapped;
  EXPECT_EQ(overlapped.find("(outside ops)"), std::string::npos) << overlapped;
}

TEST(OpProfile, InlineEventsAreTimedAndOrdered) {
  InlineStream s(DeviceId{});
  const auto a = s.record_timed();
  const auto b = s.record();
  EXPECT_GE(b->seconds_since(*a), 0.0);
}

}  // namespace
}  // namespace hpm
