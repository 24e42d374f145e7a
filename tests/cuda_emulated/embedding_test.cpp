// embedding.cu's gradient kernels after the sort (embedding_kernels.cuh), compiled for the CPU and
// run under simt.h's emulation, against the CPU's embedding_backward: runs of thousands of
// positions on a few rows beside rows met once, a row width across a chunk's 256 columns, bad
// indices (sorted last, skipped), and a table that already holds a gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/embedding_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;

void check(std::int64_t v, std::int64_t e, const std::vector<std::int64_t>& idx) {
  SCOPED_TRACE("v " + std::to_string(v) + " e " + std::to_string(e));
  const auto n = static_cast<std::int64_t>(idx.size());
  Generator gen(static_cast<std::uint64_t>(v * 31 + e));
  const Tensor grad = Tensor::randn({n, e}, gen);
  Tensor table_want = Tensor::randn({v, e}, gen);  // a gradient already there, added to
  std::vector<float> table = copy_of<float>(table_want);
  // The CPU, with the bad indices left out (it does not check them; the kernels skip them).
  std::vector<std::int64_t> good_idx;
  std::vector<float> good_grad;
  const std::vector<float> gv = copy_of<float>(grad);
  for (std::int64_t i = 0; i < n; ++i) {
    if (idx[static_cast<std::size_t>(i)] < 0 || idx[static_cast<std::size_t>(i)] >= v) continue;
    good_idx.push_back(idx[static_cast<std::size_t>(i)]);
    good_grad.insert(good_grad.end(), gv.begin() + i * e, gv.begin() + (i + 1) * e);
  }
  const auto good = static_cast<std::int64_t>(good_idx.size());
  kernels::embedding_backward(Tensor::from(good_grad, Shape{good, e}),
                              Tensor::from_i64(good_idx, Shape{good}), table_want);

  // The sort's output as embedding.cu makes it: keys (v for a bad index), stably sorted.
  std::vector<unsigned long long> keys(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    keys[i] = static_cast<unsigned long long>(idx[i] >= 0 && idx[i] < v ? idx[i] : v);
  }
  std::vector<std::int64_t> positions(idx.size());
  std::iota(positions.begin(), positions.end(), 0);
  std::stable_sort(positions.begin(), positions.end(),
                   [&](std::int64_t a, std::int64_t b) { return keys[a] < keys[b]; });
  std::vector<unsigned long long> sorted(idx.size());
  for (std::size_t i = 0; i < idx.size(); ++i) sorted[i] = keys[positions[i]];

  std::vector<std::int64_t> ends(static_cast<std::size_t>(v), -1);
  simt::launch(2, 64, 0, [&] { cuda::run_ends_kernel(sorted.data(), n, v, ends.data()); });
  // A small grid: the kernel strides over the entries (256 threads a block are 256 fibers).
  simt::launch(3, cuda::kRunThreads, 0, [&] {
    cuda::embedding_backward_kernel(gv.data(), sorted.data(), positions.data(), ends.data(),
                                    table.data(), n, v, e);
  });
  const std::vector<float> want = copy_of<float>(table_want);
  for (std::size_t i = 0; i < want.size(); ++i) {
    // Sums of up to 1500 terms in two orders: within 1e-4 (a term dropped or doubled is ~1 off).
    ASSERT_NEAR(table[i], want[i], 1e-4f * std::max(1.0f, std::abs(want[i]))) << "[" << i << "]";
  }
}

TEST(EmbeddingEmulated, LongRunsAndSingleRowsMatchTheCpu) {
  // Row 2 met 1500 times, row 5 600 times, rows 0 and 6 once, row 1 never; three bad indices.
  std::vector<std::int64_t> idx;
  for (int i = 0; i < 2100; ++i) idx.push_back(i % 7 == 3 ? 5 : 2);
  idx[10] = 0;
  idx[700] = 6;
  idx[11] = -1;
  idx[12] = 7;
  idx[2000] = 99;
  check(7, 300, idx);  // a chunk of 256 columns and one of 44
  check(7, 40, idx);
}

TEST(EmbeddingEmulated, EveryRowOnceMatchesTheCpu) {
  std::vector<std::int64_t> idx;
  for (int i = 0; i < 50; ++i) idx.push_back((i * 17) % 53);
  check(53, 96, idx);
}

}  // namespace
}  // namespace hpm
