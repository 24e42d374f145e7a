// bias_grad.cu's kernels (bias_grad_kernels.cuh), compiled for the CPU and run under simt.h's
// emulation, against the CPU's column sums: F32 and BF16 gradients, spans of rows with a short
// last one, columns across a block's 32, and no rows (zeros).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/bias_grad_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;

// bias_grad.cu's launches.
template <typename G>
std::vector<float> run(const std::vector<G>& g, std::int64_t rows, std::int64_t cols) {
  const std::int64_t span_rows =
      std::max(cuda::kBiasGradSpanRows, (rows + cuda::kBiasGradSpans - 1) / cuda::kBiasGradSpans);
  const std::int64_t spans = (rows + span_rows - 1) / span_rows;
  std::vector<double> partial(static_cast<std::size_t>(std::max<std::int64_t>(spans, 1) * cols));
  std::vector<float> db(static_cast<std::size_t>(cols), -1.0f);
  if (spans > 0) {
    simt::launch(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(spans),
                 cuda::kBiasGradThreads, 0, [&] {
                   cuda::bias_grad_partials_kernel(g.data(), partial.data(), rows, cols, span_rows);
                 });
  }
  simt::launch(cuda::grid_for((cols + 31) / 32), cuda::kSpanSumThreads, 0, [&] {
    cuda::span_sums_kernel(partial.data(), db.data(), nullptr, nullptr, spans, cols);
  });
  return db;
}

void check(std::int64_t rows, std::int64_t cols) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
  Generator gen(static_cast<std::uint64_t>(rows * 13 + cols));
  const Tensor g = Tensor::randn({rows, cols}, gen);
  const std::vector<float> want = copy_of<float>(kernels::sum_dim(g, 0, false));
  const std::vector<float> got = run(copy_of<float>(g), rows, cols);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::abs(want[i]))) << "f32 [" << i << "]";
  }
  // BF16 bits, summed as their f32 values.
  const Tensor gb = kernels::to_bf16(g);
  const std::vector<float> want_b = copy_of<float>(kernels::sum_dim(kernels::to_f32(gb), 0, false));
  const std::vector<float> got_b = run(copy_of<std::uint16_t>(gb), rows, cols);
  for (std::size_t i = 0; i < want_b.size(); ++i) {
    ASSERT_NEAR(got_b[i], want_b[i], 1e-5f * std::max(1.0f, std::abs(want_b[i])))
        << "bf16 [" << i << "]";
  }
}

// Stage 2 alone over more spans than a block has warps (each warp's two alternating sums and the
// odd span left over), against the spans added one after another: 75 spans of 40 columns, one
// block going round its two groups of 32 columns; a null output skipped.
TEST(BiasGradEmulated, SpanSumsAddEverySpan) {
  const std::int64_t spans = 75, n = 40;
  Generator gen(3);
  const std::vector<float> a = copy_of<float>(Tensor::randn({spans * n}, gen));
  const std::vector<double> part(a.begin(), a.end());
  std::vector<float> out(static_cast<std::size_t>(n), -1.0f);
  simt::launch(1, cuda::kSpanSumThreads, 0, [&] {
    cuda::span_sums_kernel(nullptr, nullptr, part.data(), out.data(), spans, n);
  });
  for (std::int64_t k = 0; k < n; ++k) {
    double want = 0.0;
    for (std::int64_t s = 0; s < spans; ++s) want += part[static_cast<std::size_t>(s * n + k)];
    ASSERT_NEAR(out[static_cast<std::size_t>(k)], want, 1e-6 * std::max(1.0, std::abs(want)))
        << "column " << k;
  }
}

TEST(BiasGradEmulated, ColumnSumsMatchTheCpu) {
  check(700, 40);   // three spans, the last short; a block of 32 columns and one of 8
  check(5, 33);     // one span of 5 rows: most warps add nothing
  check(20000, 3);  // spans of 313 rows (64 of them)
}

TEST(BiasGradEmulated, NoRowsGiveZeros) {
  const std::vector<float> got = run(std::vector<float>{}, 0, 6);
  EXPECT_EQ(got, std::vector<float>(6, 0.0f));
}

}  // namespace
}  // namespace hpm
