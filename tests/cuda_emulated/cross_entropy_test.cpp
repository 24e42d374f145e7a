// softmax.cu's cross-entropy kernels, compiled for the CPU and run under simt.h's emulation,
// against the CPU's kernels: the loss and each row's statistics, the prediction in the same pass,
// the deferred label check, and both backwards (f32 and bf16 gradients, apart and over the logits),
// for F32 and BF16 logits, rows short enough for a warp and long enough for a block. Launches as
// softmax.cu's launchers make them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/softmax_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;
using emulated::widened;

constexpr std::int64_t kIgnore = -100;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Case {
  std::int64_t n, c;
  bool bf16;
  float smoothing;
};

std::string name(const Case& k) {
  std::string s = "n";  // appended, not added: GCC 12's -Wrestrict misreads "literal" + string
  s += std::to_string(k.n);
  s += " c";
  s += std::to_string(k.c);
  s += k.bf16 ? " bf16" : " f32";
  s += " smoothing ";
  s += std::to_string(k.smoothing);
  return s;
}

// Logits with what argmax_last must get right (ties, -0 beside +0, a -inf class), labels with
// ignored rows.
struct Inputs {
  Tensor logits, labels;
};
Inputs make_inputs(const Case& k) {
  Generator gen(static_cast<std::uint64_t>(k.n * 131 + k.c));
  Tensor x = Tensor::randn({k.n, k.c}, gen, 0.0f, 3.0f);
  float* px = x.data<float>();
  std::vector<std::int64_t> y(static_cast<std::size_t>(k.n));
  for (std::int64_t r = 0; r < k.n; ++r) {
    y[static_cast<std::size_t>(r)] = r % 5 == 3 ? kIgnore : (r * 7919) % k.c;
    float* row = px + r * k.c;
    if (r % 4 == 1 && k.c > 2) row[k.c - 1] = row[k.c / 2] = 40.0f;  // a tie: the first wins
    if (r % 4 == 2 && k.c > 2) {
      std::fill(row, row + k.c, -1.0f);
      row[1] = 0.0f;   // +0 after -0: equal, so the first (-0) wins
      row[0] = -0.0f;  // ...
    }
    if (r % 6 == 5 && k.c > 3) row[2] = -kInf;  // a masked class (no smoothing term NaN)
  }
  const Tensor labels = Tensor::from_i64(y, Shape{k.n});
  return {k.bf16 ? kernels::to_bf16(x) : x, labels};
}

// cross_entropy_with_gradient_kernel, launched as cross_entropy_with_gradient_ launches it,
// against the CPU's op of that name: the loss, the prediction, and the gradient for 1 over the
// logits (F32: within 1e-5 of the largest; BF16: one rounding apart).
template <typename In>
void check_with_gradient(const Case& k, const Inputs& in, const std::vector<std::int64_t>& labels,
                         float count) {
  Tensor want_logits = in.logits.clone(), want_predicted;
  const float want = kernels::cross_entropy_with_gradient_(want_logits, in.labels, k.smoothing,
                                                           kIgnore, &want_predicted)
                         .item();
  std::vector<In> logits = copy_of<In>(in.logits);
  const auto n = static_cast<std::size_t>(k.n);
  std::vector<double> row_loss(n, -1.0);
  std::vector<std::int64_t> predicted(n, -1);
  unsigned long long error = cuda::kNoError;
  if (k.c <= cuda::kWarpRowMax) {
    simt::launch(
        cuda::grid_for((k.n + cuda::kBlock / 32 - 1) / (cuda::kBlock / 32)), cuda::kBlock, 0, [&] {
          cuda::cross_entropy_with_gradient_kernel<true>(logits.data(), labels.data(), &count,
                                                         row_loss.data(), &error, k.n, k.c,
                                                         k.smoothing, kIgnore, predicted.data());
        });
  } else {
    // A block of kBlock threads, not the launcher's kFusedRowThreads: the kernel takes any
    // multiple of 32, and 1024 emulated threads a block cost the sanitizers' runs minutes.
    simt::launch(cuda::grid_for(k.n), cuda::kBlock, 0, [&] {
      cuda::cross_entropy_with_gradient_kernel<false>(logits.data(), labels.data(), &count,
                                                      row_loss.data(), &error, k.n, k.c,
                                                      k.smoothing, kIgnore, predicted.data());
    });
  }
  float loss = -1.0f;
  simt::launch(1, 1024, 0, [&] {
    cuda::cross_entropy_mean_kernel(row_loss.data(), labels.data(), k.n, kIgnore, &loss);
  });
  EXPECT_EQ(error, cuda::kNoError);
  if (std::isinf(want)) {
    EXPECT_EQ(loss, want) << "fused loss";
  } else {
    EXPECT_NEAR(loss, want, 1e-5f * std::max(1.0f, std::abs(want))) << "fused loss";
  }
  EXPECT_EQ(predicted, copy_of<std::int64_t>(want_predicted)) << "fused predicted";
  const std::vector<In> gw = copy_of<In>(want_logits);
  float size = 0.0f;
  for (const In x : gw) size = std::max(size, std::abs(widened(x)));
  for (std::size_t i = 0; i < gw.size(); ++i) {
    const float got = widened(logits[i]), w = widened(gw[i]);
    if constexpr (std::is_same_v<In, float>) {
      ASSERT_NEAR(got, w, 1e-5f * size) << "fused f32 gradient [" << i << "]";
    } else {
      ASSERT_NEAR(got, w, std::abs(w) / 128.0f + 1e-30f) << "fused bf16 gradient [" << i << "]";
    }
  }
}

template <typename In>
void check_case(const Case& k) {
  SCOPED_TRACE(name(k));
  const Inputs in = make_inputs(k);
  // The CPU's figures.
  Tensor stats_want, predicted_want;
  const Tensor loss_want = kernels::cross_entropy_forward(in.logits, in.labels, k.smoothing,
                                                          stats_want, kIgnore, &predicted_want);
  const Tensor grad = Tensor::from({0.75f}, Shape{});
  const Tensor gx_want =
      kernels::cross_entropy_backward(in.logits, stats_want, in.labels, k.smoothing, grad, kIgnore);
  const Tensor gx16_want = kernels::cross_entropy_backward_bf16(in.logits, stats_want, in.labels,
                                                                k.smoothing, grad, kIgnore);

  // The kernels, launched as cross_entropy_forward launches them.
  const std::vector<In> logits = copy_of<In>(in.logits);
  const std::vector<std::int64_t> labels = copy_of<std::int64_t>(in.labels);
  const auto n = static_cast<std::size_t>(k.n);
  std::vector<float> stats(2 * n, -1.0f);
  std::vector<double> row_loss(n, -1.0);
  std::vector<std::int64_t> predicted(n, -1);
  unsigned long long error = cuda::kNoError;
  float loss = -1.0f;
  const auto rows = [&] {
    if (k.c <= cuda::kWarpRowMax) {
      return std::pair<unsigned, bool>(
          cuda::grid_for((k.n + cuda::kBlock / 32 - 1) / (cuda::kBlock / 32)), true);
    }
    return std::pair<unsigned, bool>(cuda::grid_for(k.n), false);
  }();
  simt::launch(rows.first, cuda::kBlock, 0, [&] {
    if (rows.second) {
      cuda::cross_entropy_rows_kernel<true>(logits.data(), labels.data(), stats.data(),
                                            row_loss.data(), &error, k.n, k.c, k.smoothing, kIgnore,
                                            predicted.data());
    } else {
      cuda::cross_entropy_rows_kernel<false>(logits.data(), labels.data(), stats.data(),
                                             row_loss.data(), &error, k.n, k.c, k.smoothing,
                                             kIgnore, predicted.data());
    }
  });
  simt::launch(1, 1024, 0, [&] {
    cuda::cross_entropy_mean_kernel(row_loss.data(), labels.data(), k.n, kIgnore, &loss);
  });
  EXPECT_EQ(error, cuda::kNoError);
  const float want = loss_want.item();
  if (std::isinf(want)) {
    EXPECT_EQ(loss, want) << "loss";  // smoothing over a -inf class: +inf on both
  } else {
    EXPECT_NEAR(loss, want, 1e-5f * std::max(1.0f, std::abs(want))) << "loss";
  }
  EXPECT_EQ(predicted, copy_of<std::int64_t>(predicted_want)) << "predicted";
  const std::vector<float> sw = copy_of<float>(stats_want);
  for (std::size_t i = 0; i < sw.size(); ++i) {
    // The CPU sums exp in float blocks, this kernel in double: a few units in the last place.
    ASSERT_NEAR(stats[i], sw[i], 1e-5f * std::abs(sw[i])) << "stats[" << i << "]";
  }

  // The backwards from the CPU's statistics, as run_cross_entropy_backward launches them.
  const std::vector<float> g = copy_of<float>(grad);
  float count = -1.0f;
  simt::launch(1, 1024, 0, [&] { cuda::count_labels_kernel(labels.data(), k.n, kIgnore, &count); });
  ASSERT_EQ(count, static_cast<float>(std::count_if(labels.begin(), labels.end(),
                                                    [](std::int64_t y) { return y != kIgnore; })));
  const unsigned grid = cuda::grid_for(k.n),
                 threads = cuda::row_threads(k.c % 8 == 0 ? k.c / 8 : k.c);
  std::vector<float> gx(logits.size(), kNaN);
  simt::launch(grid, threads, 0, [&] {
    cuda::cross_entropy_backward_kernel(logits.data(), sw.data(), labels.data(), g.data(), &count,
                                        gx.data(), k.n, k.c, k.smoothing, kIgnore);
  });
  const std::vector<float> gw = copy_of<float>(gx_want);
  float size = 0.0f;
  for (const float x : gw) size = std::max(size, std::abs(x));
  for (std::size_t i = 0; i < gw.size(); ++i) {
    ASSERT_NEAR(gx[i], gw[i], 1e-5f * size) << "f32 gradient [" << i << "]";
  }
  // The bf16 gradient, written over the logits where they are bf16 (the in-place case).
  std::vector<std::uint16_t> gx16(logits.size(), 0xffffu);
  std::vector<In> overwritten = logits;
  simt::launch(grid, threads, 0, [&] {
    if constexpr (std::is_same_v<In, std::uint16_t>) {
      cuda::cross_entropy_backward_kernel(overwritten.data(), sw.data(), labels.data(), g.data(),
                                          &count, overwritten.data(), k.n, k.c, k.smoothing,
                                          kIgnore);
    } else {
      cuda::cross_entropy_backward_kernel(logits.data(), sw.data(), labels.data(), g.data(), &count,
                                          gx16.data(), k.n, k.c, k.smoothing, kIgnore);
    }
  });
  if constexpr (std::is_same_v<In, std::uint16_t>) gx16 = overwritten;
  const std::vector<std::uint16_t> g16w = copy_of<std::uint16_t>(gx16_want);
  for (std::size_t i = 0; i < g16w.size(); ++i) {
    // One rounding of values within 1e-6 of each other: the same bf16, or its neighbour.
    ASSERT_NEAR(widened(gx16[i]), widened(g16w[i]), std::abs(widened(g16w[i])) / 128.0f + 1e-30f)
        << "bf16 gradient [" << i << "]";
  }
  check_with_gradient<In>(k, in, labels, count);
}

TEST(CrossEntropyEmulated, WarpRowsMatchTheCpu) {
  check_case<float>({37, 65, false, 0.0f});
  check_case<float>({37, 65, false, 0.1f});
  check_case<std::uint16_t>({37, 65, true, 0.0f});
  // Rows of a multiple of 8 logits: eight a 16-byte access.
  check_case<float>({37, 256, false, 0.0f});
  check_case<std::uint16_t>({37, 256, true, 0.1f});
}

TEST(CrossEntropyEmulated, BlockRowsMatchTheCpu) {
  check_case<float>({6, 5003, false, 0.0f});
  check_case<float>({6, 4096, false, 0.1f});
  // 513 groups of eight for 256 threads: one thread's last pair has no second group.
  check_case<std::uint16_t>({6, 4104, true, 0.0f});
  // Under a sanitizer, the three above: rows not a multiple of 8, smoothing, the short last pair
  // (simt.h's kUnderSanitizer says why).
  if (simt::kUnderSanitizer) return;
  check_case<std::uint16_t>({6, 5003, true, 0.1f});
  check_case<std::uint16_t>({6, 4096, true, 0.0f});
  check_case<float>({6, 4104, false, 0.1f});
}

// A label outside [0, C) leaves the smallest such row in the check word, whatever the order the
// rows ran in, and no bad read.
TEST(CrossEntropyEmulated, ABadLabelRecordsItsFirstRow) {
  const std::int64_t n = 20, c = 40;
  Generator gen(5);
  const std::vector<float> logits = copy_of<float>(Tensor::randn({n, c}, gen));
  std::vector<std::int64_t> labels(n, 1);
  labels[13] = c;
  labels[4] = -1;
  labels[17] = 1 << 20;
  std::vector<float> stats(2 * n);
  std::vector<double> row_loss(n);
  unsigned long long error = cuda::kNoError;
  simt::launch(cuda::grid_for((n + 7) / 8), cuda::kBlock, 0, [&] {
    cuda::cross_entropy_rows_kernel<true>(logits.data(), labels.data(), stats.data(),
                                          row_loss.data(), &error, n, c, 0.0, kIgnore,
                                          static_cast<std::int64_t*>(nullptr));
  });
  EXPECT_EQ(error, 4u);
  EXPECT_EQ(row_loss[4], 0.0);
}

// argmax_last's NaN rule: a NaN first element is the answer, NaNs elsewhere are passed over.
void check_nan_rows(std::int64_t c);

// And the statistics of rows with NaNs and of a row of -inf, as the CPU's (NaN), by the
// one-by-one loop (50 classes) and the eight-at-a-time one (48).
TEST(CrossEntropyEmulated, PredictionPassesOverNaNsUnlessFirst) {
  for (const std::int64_t c : {50, 48}) {
    SCOPED_TRACE(c);
    check_nan_rows(c);
  }
}

void check_nan_rows(std::int64_t c) {
  std::vector<float> logits(5 * c, 0.0f);
  logits[0] = kNaN;                                       // row 0: NaN first
  logits[5] = 1.0f;                                       // ...
  logits[c + 3] = kNaN;                                   // row 1: NaN elsewhere, max at 7
  logits[c + 7] = 2.0f;                                   // ...
  for (int j = 0; j < c; ++j) logits[2 * c + j] = -kInf;  // row 2: all -inf: the first
  logits[3 * c + 9] = kInf;                               // row 3: one +inf (exp(inf - inf))
  logits[4 * c + 2] = kInf;                               // row 4: two, the first wins
  logits[4 * c + 40] = kInf;                              // ...
  constexpr std::int64_t kRows = 5;
  const std::vector<std::int64_t> labels(kRows, 0);
  std::vector<float> stats(2 * kRows);
  std::vector<double> row_loss(kRows);
  std::vector<std::int64_t> predicted(kRows, -1);
  unsigned long long error = cuda::kNoError;
  simt::launch(1, cuda::kBlock, 0, [&] {
    cuda::cross_entropy_rows_kernel<true>(logits.data(), labels.data(), stats.data(),
                                          row_loss.data(), &error, kRows, c, 0.0, kIgnore,
                                          predicted.data());
  });
  const Tensor want = kernels::argmax_last(Tensor::from(logits, Shape{kRows, c}));
  EXPECT_EQ(predicted, copy_of<std::int64_t>(want));
  EXPECT_EQ(predicted, (std::vector<std::int64_t>{0, 7, 0, 9, 2}));
  Tensor stats_want;
  kernels::cross_entropy_forward(Tensor::from(logits, Shape{kRows, c}),
                                 Tensor::from_i64(labels, Shape{kRows}), 0.0f, stats_want, kIgnore);
  const std::vector<float> sw = copy_of<float>(stats_want);
  for (std::size_t i = 0; i < sw.size(); ++i) {
    if (std::isnan(sw[i])) {
      EXPECT_TRUE(std::isnan(stats[i])) << "stats[" << i << "] " << stats[i];
    } else {
      EXPECT_EQ(stats[i], sw[i]) << "stats[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace hpm
