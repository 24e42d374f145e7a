#include "hpm/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

TEST(Device, CountsCurrentAndPeakBytes) {
  Device dev("test", Device::kUnlimited);
  {
    Tensor a = Tensor::empty({1000}, DType::F32, dev);  // 4000 -> 4032 rounded to 64
    EXPECT_EQ(dev.stats().current_bytes, 4032u);
    {
      Tensor b = Tensor::empty({10}, DType::F32, dev);
      EXPECT_EQ(dev.stats().current_bytes, 4032u + 64u);
    }
    EXPECT_EQ(dev.stats().current_bytes, 4032u);
    EXPECT_EQ(dev.stats().peak_bytes, 4096u);
  }
  EXPECT_EQ(dev.stats().current_bytes, 0u);
  EXPECT_EQ(dev.stats().cached_bytes, 4096u);
  dev.reset_peak();
  EXPECT_EQ(dev.stats().peak_bytes, 0u);
}

TEST(Device, ReusesFreedBlocks) {
  Device dev("test");
  void* first = nullptr;
  {
    Tensor a = Tensor::empty({256}, DType::F32, dev);
    first = a.raw_data();
  }
  Tensor b = Tensor::empty({256}, DType::F32, dev);
  EXPECT_EQ(b.raw_data(), first);
  EXPECT_EQ(dev.stats().cache_hits, 1u);
}

TEST(Device, BudgetIsEnforcedWithAClearError) {
  Device dev("small", 1024);
  Tensor a = Tensor::empty({128}, DType::F32, dev);  // 512 bytes
  try {
    Tensor b = Tensor::empty({256}, DType::F32, dev);  // 1024 more: over budget
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("small"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
  }
  // The failed request changed nothing.
  EXPECT_EQ(dev.stats().current_bytes, 512u);
}

TEST(Device, CacheIsDroppedToFitTheBudget) {
  Device dev("tight", 1024);
  { Tensor a = Tensor::empty({200}, DType::F32, dev); }  // 832 cached
  Tensor b = Tensor::empty({250}, DType::F32, dev);      // 1024: fits only without the cache
  EXPECT_EQ(dev.stats().current_bytes, 1024u);
}

TEST(Device, GuardRoutesNewTensorsOfTheCallingThreadOnly) {
  Device stage("stage0");
  EXPECT_EQ(&Device::current(), &Device::cpu());
  {
    DeviceGuard guard(stage);
    Tensor a = Tensor::zeros({16});
    EXPECT_EQ(&a.device(), &stage);
    EXPECT_EQ(stage.stats().current_bytes, 64u);
    Device* seen_elsewhere = nullptr;
    std::thread([&] { seen_elsewhere = &Device::current(); }).join();
    EXPECT_EQ(seen_elsewhere, &Device::cpu());
    {
      Device inner("inner");
      DeviceGuard nested(inner);
      EXPECT_EQ(&Device::current(), &inner);
    }
    EXPECT_EQ(&Device::current(), &stage);
  }
  EXPECT_EQ(&Device::current(), &Device::cpu());
}

TEST(Device, StorageMovesWithItsViewsAndKeepsTheBytes) {
  Device gpu("gpu", 4096);
  Device host("host");
  const std::vector<float> values{1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::from(values, {3, 2}, gpu);
  Tensor view = t.reshape({6}).narrow(2, 3);
  t.impl()->storage->move_to(host);
  EXPECT_EQ(gpu.stats().current_bytes, 0u);
  EXPECT_EQ(&view.device(), &host);
  EXPECT_EQ(view.to_vector(), (std::vector<float>{3, 4, 5}));
  t.impl()->storage->move_to(gpu);
  EXPECT_EQ(gpu.stats().current_bytes, 64u);
  EXPECT_EQ(host.stats().current_bytes, 0u);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  Device tiny("tiny", 32);
  EXPECT_THROW(t.impl()->storage->move_to(tiny), OutOfMemoryError);
  EXPECT_EQ(&t.device(), &gpu);  // a failed move changes nothing
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from({0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor r = t.reshape({2, -1});
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_TRUE(r.same_storage(t));
  Tensor rows = t.narrow(1, 2);
  EXPECT_EQ(rows.to_vector(), (std::vector<float>{2, 3, 4, 5}));
  rows.fill_(9.0f);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 1, 9, 9, 9, 9}));
  EXPECT_THROW(t.reshape({4, 2}), std::invalid_argument);
  EXPECT_THROW(t.narrow(2, 2), std::out_of_range);
}

TEST(Tensor, DtypeIsChecked) {
  Tensor t = Tensor::zeros({2}, DType::I64);
  EXPECT_THROW(t.data<float>(), std::logic_error);
  EXPECT_THROW(t.set_requires_grad(true), std::logic_error);
}

TEST(Kernels, BroadcastingBinary) {
  Tensor a = Tensor::from({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor col = Tensor::from({10, 20}, {2, 1});
  Tensor row = Tensor::from({1, 1, 1}, {3});
  EXPECT_EQ(kernels::binary(kernels::BinaryOp::Add, a, col).to_vector(),
            (std::vector<float>{11, 12, 13, 24, 25, 26}));
  EXPECT_EQ(kernels::binary(kernels::BinaryOp::Sub, a, row).to_vector(),
            (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(kernels::binary(kernels::BinaryOp::Add, a, Tensor::zeros({2})),
               std::invalid_argument);
  EXPECT_EQ(kernels::sum_to(a, {2, 1}).to_vector(), (std::vector<float>{6, 15}));
  EXPECT_EQ(kernels::sum_to(a, {3}).to_vector(), (std::vector<float>{5, 7, 9}));
}

TEST(Kernels, GemmMatchesNaiveProduct) {
  Generator gen(3);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Tensor a = Tensor::randn(ta ? Shape{7, 5} : Shape{5, 7}, gen);
      Tensor b = Tensor::randn(tb ? Shape{9, 7} : Shape{7, 9}, gen);
      Tensor c = kernels::matmul(a, b, ta, tb);
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 9; ++j) {
          double s = 0;
          for (int k = 0; k < 7; ++k) {
            float av = ta ? a.data<float>()[k * 5 + i] : a.data<float>()[i * 7 + k];
            float bv = tb ? b.data<float>()[j * 7 + k] : b.data<float>()[k * 9 + j];
            s += av * bv;
          }
          EXPECT_NEAR(c.data<float>()[i * 9 + j], s, 1e-4);
        }
    }
}

// Short products with B's rows 2 KiB apart go through a padded copy of B (gemm.cpp); B here is a
// view (600 of 1024 columns), alpha and beta are not 1, and C has its own leading dimension.
TEST(Kernels, GemmThroughPaddedCopyOfBMatchesNaiveProduct) {
  Generator gen(4);
  const std::int64_t m = 40, n = 600, k = 33, ldb = 1024, ldc = 610;
  ASSERT_TRUE(cpu::gemm_pads_b(false, m, n, ldb));
  ASSERT_FALSE(cpu::gemm_pads_b(true, m, n, ldb));
  ASSERT_FALSE(cpu::gemm_pads_b(false, 2048, 1024, ldb));  // long products pack B themselves
  ASSERT_FALSE(cpu::gemm_pads_b(false, m, n, 600));
  Tensor a = Tensor::randn({m, k}, gen), b = Tensor::randn({k, ldb}, gen);
  Tensor c = Tensor::randn({m, ldc}, gen);
  const std::vector<float> c0 = c.to_vector();
  cpu::gemm(false, false, m, n, k, 0.5f, a.data<float>(), k, b.data<float>(), ldb, 2.0f,
            c.data<float>(), ldc);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      if (j >= n) {
        EXPECT_EQ(c.data<float>()[at], c0[at]) << "outside C's columns";
        continue;
      }
      double s = 0;
      for (std::int64_t q = 0; q < k; ++q)
        s += static_cast<double>(a.data<float>()[i * k + q]) * b.data<float>()[q * ldb + j];
      EXPECT_NEAR(c.data<float>()[at], 0.5 * s + 2.0 * c0[at], 1e-4);
    }
}

TEST(Kernels, ConvolutionMatchesDirectLoop) {
  Generator gen(5);
  Tensor x = Tensor::randn({2, 3, 7, 6}, gen), w = Tensor::randn({4, 3, 3, 3}, gen);
  Tensor b = Tensor::randn({4}, gen);
  kernels::Conv2dParams p{2, 1, 1, 0};
  Tensor y = kernels::conv2d_forward(x, w, b, p);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 4, 4}));
  for (int n = 0; n < 2; ++n)
    for (int o = 0; o < 4; ++o)
      for (int oh = 0; oh < 4; ++oh)
        for (int ow = 0; ow < 4; ++ow) {
          double s = b.data<float>()[o];
          for (int c = 0; c < 3; ++c)
            for (int i = 0; i < 3; ++i)
              for (int j = 0; j < 3; ++j) {
                int ih = oh * 2 - 1 + i, iw = ow + j;
                if (ih < 0 || ih >= 7 || iw < 0 || iw >= 6) continue;
                s += x.data<float>()[((n * 3 + c) * 7 + ih) * 6 + iw] *
                     w.data<float>()[((o * 3 + c) * 3 + i) * 3 + j];
              }
          EXPECT_NEAR(y.data<float>()[((n * 4 + o) * 4 + oh) * 4 + ow], s, 1e-4);
        }
}

TEST(Random, SeededAndRestorable) {
  Generator a(7), b(7);
  EXPECT_EQ(a.next_u64(), b.next_u64());
  auto st = a.state();
  const float x = a.normal();
  a.set_state(st);
  EXPECT_EQ(a.normal(), x);
  double mean = 0;
  for (int i = 0; i < 10000; ++i) mean += a.normal();
  EXPECT_NEAR(mean / 10000, 0.0, 0.05);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(a.below(10), 10u);
}

}  // namespace
}  // namespace hpm

namespace hpm {
namespace {

TEST(Kernels, MaxPoolTiesAndNaNFollowPyTorch) {
  // One 2x2 window per case: values in row-major order, expected winner index.
  struct Case {
    std::vector<float> v;
    int expected;
  };
  const float nan = std::nanf("");
  for (const Case& c : std::vector<Case>{{{1, 5, 5, 0}, 1},
                                         {{0, 0, 0, 0}, 0},
                                         {{1, 2, 3, 4}, 3},
                                         {{4, 3, 4, 1}, 0},
                                         {{1, nan, 2, 3}, 1},
                                         {{nan, 9, 2, nan}, 0},
                                         {{1, 2, 7, 7}, 2}}) {
    Tensor x = Tensor::from(c.v, {1, 1, 2, 2}), arg;
    Tensor y = kernels::max_pool2d_forward(x, kernels::Pool2dParams{}, arg);
    EXPECT_EQ(arg.data<std::int32_t>()[0], c.expected)
        << c.v[0] << " " << c.v[1] << " " << c.v[2] << " " << c.v[3];
  }
}

// Any other window keeps the first NaN too (the 2x2/2 path's rule), not the last.
TEST(Kernels, MaxPoolOfAnyWindowKeepsTheFirstNaN) {
  const float nan = std::nanf("");
  Tensor x = Tensor::from({nan, 1, 2, 3, 4, 5, 6, 7, nan}, {1, 1, 3, 3}), arg;
  kernels::Pool2dParams p;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 1;
  const Tensor y = kernels::max_pool2d_forward(x, p, arg);
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(arg.data<std::int32_t>()[0], 0);
}

// The vectorized 2x2/2 path against a plain loop over every window, on planes of odd and even
// sizes (a trailing row or column no window covers) with many ties and a few NaNs: the same
// maxima and the same winners (the first NaN, else the first maximum in row-major order).
TEST(Kernels, MaxPool2x2MatchesAPlainLoopOverEveryWindow) {
  Generator gen(4);
  for (const auto& [h, w] : std::vector<std::pair<int, int>>{{28, 28}, {7, 9}, {2, 2}, {5, 34}}) {
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w));
    Tensor x = Tensor::randn({3, 2, h, w}, gen);
    float* v = x.data<float>();
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      v[i] = std::round(v[i] * 2.0f);  // few distinct values: ties everywhere
      if (i % 37 == 5) v[i] = std::nanf("");
    }
    Tensor arg;
    const Tensor y = kernels::max_pool2d_forward(x, kernels::Pool2dParams{}, arg);
    const int oh = h / 2, ow = w / 2;
    ASSERT_EQ(y.shape(), (Shape{3, 2, oh, ow}));
    for (int pl = 0; pl < 6; ++pl) {
      const float* src = v + pl * h * w;
      for (int r = 0; r < oh; ++r) {
        for (int c = 0; c < ow; ++c) {
          int best = -1;
          for (int i : {2 * r * w + 2 * c, 2 * r * w + 2 * c + 1, (2 * r + 1) * w + 2 * c,
                        (2 * r + 1) * w + 2 * c + 1}) {
            const bool nan_seen = best >= 0 && std::isnan(src[best]);
            if (best < 0 || (!nan_seen && (std::isnan(src[i]) || src[i] > src[best]))) best = i;
          }
          const int o = (pl * oh + r) * ow + c;
          ASSERT_EQ(arg.data<std::int32_t>()[o], best)
              << "plane " << pl << " window " << r << "," << c;
          const float got = y.data<float>()[o];
          EXPECT_TRUE(got == src[best] || (std::isnan(got) && std::isnan(src[best])));
        }
      }
    }
  }
}

}  // namespace
}  // namespace hpm
