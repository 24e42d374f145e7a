// reduce.cu's kernels (reduce_kernels.cuh: the sum plan's two passes, the squared norm over a list
// of tensors, argmax_last, count_matches), compiled for the CPU and run under simt.h's emulation
// with the grids and lists the launchers choose, against the CPU's kernels. Each sum case names
// the path it must take (threads or blocks, one chunk or several), so that the plans' every branch
// runs: a bias gradient's column sums, rows long and short, reduced dimensions apart (the walk of
// a multi-index from a chunk's middle), a whole tensor, an empty range.
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
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/reduce_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;

// Pass 1 and, with several chunks, pass 2, as reduce.cu's run_reduce launches them.
template <bool Square, typename Out>
std::vector<Out> emulated_sum(const std::vector<float>& x, const cuda::ReducePlan& p) {
  const cuda::ReduceGrid g = cuda::reduce_grid(p);
  std::vector<Out> y(static_cast<std::size_t>(p.outputs), static_cast<Out>(-12345));
  std::vector<double> partials(g.splits > 1 ? static_cast<std::size_t>(g.items) : 0,
                               std::numeric_limits<double>::quiet_NaN());
  double* pp = partials.empty() ? nullptr : partials.data();
  simt::launch(g.blocks, cuda::kThreads, 0, [&] {
    if (g.threads) {
      cuda::reduce_threads_kernel<Square, Out>(x.data(), p, g.splits, g.chunk, y.data(), pp);
    } else {
      cuda::reduce_blocks_kernel<Square, Out>(x.data(), p, g.splits, g.chunk, y.data(), pp);
    }
  });
  if (g.splits > 1) {
    simt::launch(cuda::grid_for(cuda::ceil_div(p.outputs, cuda::kThreads)), cuda::kThreads, 0,
                 [&] { cuda::reduce_finish_kernel<Out>(pp, p.outputs, g.splits, y.data()); });
  }
  return y;
}

// Each output within 1e-6 of the sum of its summands' magnitudes (the two sum in other orders; a
// wrong offset or chunk is off by whole elements).
void expect_sums(const std::vector<float>& got, const Tensor& want, const Tensor& magnitudes) {
  const std::vector<float> w = copy_of<float>(want), m = copy_of<float>(magnitudes);
  ASSERT_EQ(got.size(), w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    ASSERT_NEAR(got[i], w[i], 1e-6f * m[i] + 1e-30f) << "output " << i;
  }
}

Tensor magnitudes_of(const Tensor& x) {
  std::vector<float> v = copy_of<float>(x);
  for (float& e : v) e = std::abs(e);
  return Tensor::from(v, x.shape());
}

struct Path {
  bool threads;
  bool chunked;  // more than one chunk per output (pass 2 runs)
};

void expect_path(const cuda::ReducePlan& p, Path want) {
  const cuda::ReduceGrid g = cuda::reduce_grid(p);
  EXPECT_EQ(g.threads, want.threads) << "the case does not take the path it is meant to test";
  EXPECT_EQ(g.splits > 1, want.chunked) << "the case does not take the path it is meant to test";
}

// sum_to(x, shape) on the CPU against the plan's kernels.
void check_sum_to(const Shape& x_shape, const Shape& to, Path path) {
  SCOPED_TRACE(x_shape.str() + " -> " + to.str());
  Generator gen(static_cast<std::uint64_t>(x_shape.numel() + to.numel()));
  const Tensor x = Tensor::randn(x_shape, gen);
  const int lead = x.dim() - to.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(x.dim()), true);
  for (int i = 0; i < to.rank(); ++i) {
    reduced[static_cast<std::size_t>(lead + i)] = to[i] != x.size(lead + i);
  }
  const cuda::ReducePlan p = cuda::make_plan(x.shape(), reduced, "test");
  expect_path(p, path);
  expect_sums(emulated_sum<false, float>(copy_of<float>(x), p), kernels::sum_to(x, to),
              kernels::sum_to(magnitudes_of(x), to));
}

TEST(ReduceEmulated, SumPlansMatchTheCpu) {
  // A bias gradient: (N, C) -> (C), a thread per column, several chunks.
  check_sum_to(Shape{3000, 70}, Shape{70}, {true, true});
  // Long rows: a block per row chunk.
  check_sum_to(Shape{3, 20000}, Shape{3, 1}, {false, true});
  // Short rows (32 or fewer summands): a thread per row.
  check_sum_to(Shape{300, 20}, Shape{300, 1}, {true, false});
  // Two reduced dimensions apart, the kept innermost: threads walking a multi-index from the
  // middle of each chunk.
  check_sum_to(Shape{30, 40, 9, 33}, Shape{40, 1, 33}, {true, true});
  // Two reduced dimensions apart, the kept one outer: blocks with a multi-index per element.
  check_sum_to(Shape{20, 6, 300}, Shape{6, 1}, {false, true});
  // Nothing to sum: zeros.
  check_sum_to(Shape{0, 5}, Shape{5}, {true, false});
}

TEST(ReduceEmulated, WholeTensorSumsMatchTheCpu) {
  Generator gen(5);
  const Tensor x = Tensor::randn({70001}, gen);
  const cuda::ReducePlan p = cuda::whole(x.numel());
  expect_path(p, {false, true});
  const std::vector<float> xv = copy_of<float>(x);
  const float sum = emulated_sum<false, float>(xv, p)[0];
  const double squares = emulated_sum<true, double>(xv, p)[0];
  double magnitude = 0.0;
  for (const float v : xv) magnitude += std::abs(v);
  EXPECT_NEAR(sum, kernels::sum_all(x).item<float>(), 1e-6 * magnitude);
  EXPECT_NEAR(squares, copy_of<double>(kernels::sum_squares(x))[0],
              1e-12 * copy_of<double>(kernels::sum_squares(x))[0]);
}

// squared_norm's lists as reduce.cu packs them: more tensors than a list holds, sizes around the
// chunk, empty ones.
TEST(ReduceEmulated, SquaredNormOfManyTensorsMatchesTheCpu) {
  const std::int64_t sizes[] = {16384, 1, 0, 16385, 50000, 7, 32768};
  Generator gen(6);
  std::vector<Tensor> xs;
  std::vector<std::vector<float>> values;
  std::int64_t chunks = 0;  // as reduce.cu counts the partials
  for (int i = 0; i < 60; ++i) {
    const std::int64_t n = sizes[i % 7];
    xs.push_back(Tensor::randn({n}, gen, 0.0f, 1.0f + static_cast<float>(i % 5)));
    values.push_back(copy_of<float>(xs.back()));
    chunks += cuda::ceil_div(n, cuda::kNormChunk);
  }
  std::vector<double> partials(static_cast<std::size_t>(chunks),
                               std::numeric_limits<double>::quiet_NaN());
  std::int64_t done = 0;
  int launches = 0;
  const auto launch = [&](const cuda::NormList& l, unsigned blocks) {
    ++launches;
    simt::launch(blocks, cuda::kThreads, 0,
                 [&] { cuda::chunk_squares_kernel(l, partials.data() + done); });
    done += blocks;
  };
  cuda::NormPacker packer;
  for (const std::vector<float>& v : values) {
    if (!v.empty()) packer.add(v.data(), static_cast<std::int64_t>(v.size()), launch);
  }
  packer.flush(launch);
  EXPECT_EQ(launches, 2);  // 52 non-empty tensors: a full list of 48, then 4
  EXPECT_EQ(done, chunks);
  double total = std::numeric_limits<double>::quiet_NaN();
  simt::launch(1, cuda::kThreads, 0,
               [&] { cuda::add_partials_kernel(partials.data(), chunks, &total); });
  const double want = copy_of<double>(kernels::squared_norm(xs))[0];
  EXPECT_NEAR(total, want, 1e-12 * want);
}

// argmax_last's rows as the CPU reads them: the first largest, a NaN first element kept, NaNs
// elsewhere skipped, ties, -0 beside +0, rows of -inf or NaN only; F32 and BF16.
TEST(ReduceEmulated, ArgmaxLastMatchesTheCpu) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::int64_t d : {1, 31, 33, 100, 517}) {
    SCOPED_TRACE("d " + std::to_string(d));
    Generator gen(static_cast<std::uint64_t>(d));
    const std::int64_t rows = 40;
    std::vector<float> v = copy_of<float>(Tensor::randn({rows, d}, gen));
    const auto at = [&](std::int64_t r, std::int64_t j) -> float& {
      return v[static_cast<std::size_t>(r * d + std::min(j, d - 1))];
    };
    at(1, 0) = nan;                                        // a NaN first: the answer stays 0
    for (std::int64_t j = 0; j < d; ++j) at(2, j) = nan;   // all NaN
    for (std::int64_t j = 0; j < d; ++j) at(3, j) = -inf;  // all -inf
    at(4, d / 2) = 9.0f;                                   // a tie: the first wins
    at(4, d - 1) = 9.0f;
    at(5, d / 3) = nan;  // a NaN in the middle, skipped
    at(5, d - 1) = 7.0f;
    for (std::int64_t j = 0; j < d; ++j) at(6, j) = 0.0f;  // -0 after +0: equal, the first wins
    at(6, d - 1) = -0.0f;
    for (std::int64_t j = 0; j < d; ++j) at(7, j) = -1.0f;
    at(7, d / 2) = -0.0f;
    at(7, d - 1) = 0.0f;
    const Tensor x = Tensor::from(v, Shape{rows, d});
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(bf16 ? "bf16" : "f32");
      const Tensor in = bf16 ? kernels::to_bf16(x) : x;
      const std::vector<std::int64_t> want = copy_of<std::int64_t>(kernels::argmax_last(in));
      std::vector<std::int64_t> got(static_cast<std::size_t>(rows), -7);
      const unsigned blocks = cuda::grid_for(cuda::ceil_div(rows, cuda::kThreads / 32));
      if (bf16) {
        const std::vector<std::uint16_t> bits = copy_of<std::uint16_t>(in);
        simt::launch(blocks, cuda::kThreads, 0,
                     [&] { cuda::argmax_last_kernel(bits.data(), rows, d, got.data()); });
      } else {
        simt::launch(blocks, cuda::kThreads, 0,
                     [&] { cuda::argmax_last_kernel(v.data(), rows, d, got.data()); });
      }
      EXPECT_EQ(got, want);
    }
  }
}

TEST(ReduceEmulated, CountMatchesMatchesTheCpu) {
  const std::int64_t n = 10007, ignore = 3;
  Generator gen(8);
  std::vector<std::int64_t> predicted(n), labels(n);
  for (std::int64_t i = 0; i < n; ++i) {
    predicted[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(gen.below(5));
    labels[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(gen.below(5));
  }
  const std::vector<std::int64_t> want = copy_of<std::int64_t>(kernels::count_matches(
      Tensor::from_i64(predicted, Shape{n}), Tensor::from_i64(labels, Shape{n}), ignore));
  unsigned long long counts[2] = {0, 0};
  simt::launch(cuda::grid_for(cuda::ceil_div(n, cuda::kThreads)), cuda::kThreads, 0, [&] {
    cuda::count_matches_kernel(predicted.data(), labels.data(), n, ignore, counts);
  });
  ASSERT_EQ(want.size(), 2u);
  EXPECT_EQ(static_cast<std::int64_t>(counts[0]), want[0]);
  EXPECT_EQ(static_cast<std::int64_t>(counts[1]), want[1]);
  EXPECT_GT(want[0], 0);
  EXPECT_LT(want[1], n);  // some labels were ignored
}

}  // namespace
}  // namespace hpm
