// norm.cu's layer-norm kernels (norm_kernels.cuh), compiled for the CPU and run under simt.h's
// emulation, against the CPU's kernels: the forward in f32, in bf16 with the input's bf16 copy,
// and summing a residual first (the GPT's fused forms); the backward from an f32 or a bf16 x, into
// a new gradient or added into one; the weight and bias gradients' two-stage column sums. Rows
// short enough for a warp (96) and long enough for a block (1500), launched as norm.cu launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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
#include "tensor/backend/cuda/norm_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;
using emulated::widened;

constexpr float kEps = 1e-5f;

// |got - want| within `tolerance` of the largest |want|.
void expect_close(const std::vector<float>& got, const Tensor& want_tensor, float tolerance,
                  const char* what) {
  const std::vector<float> want = copy_of<float>(want_tensor);
  ASSERT_EQ(got.size(), want.size()) << what;
  float size = 1e-30f;
  for (const float w : want) size = std::max(size, std::abs(w));
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * size) << what << " [" << i << "]";
  }
}

// Element by element, one bf16 rounding apart at most.
void expect_bf16_close(const std::vector<std::uint16_t>& got, const Tensor& want_tensor,
                       const char* what) {
  const std::vector<std::uint16_t> want = copy_of<std::uint16_t>(want_tensor);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float g = widened(got[i]), w = widened(want[i]);
    ASSERT_LE(std::abs(g - w), std::abs(w) / 128.0f + 1e-6f) << what << " [" << i << "]";
  }
}

// norm.cu's grids: a warp a row, held in registers (slots a lane as norm.cu picks them), for rows
// of up to kWarpRowMax, else a block a row. body gets the slots (0 for the block kernels) and
// whether the row fills them.
constexpr unsigned kBlocksCap = 3;

template <typename Body>
void launch_rows(std::int64_t rows, std::int64_t n, unsigned warp_grid, Body&& body) {
  if (n <= cuda::kWarpRowMax) {
    cuda::with_row_slots(n, [&](auto slots, auto full) {
      simt::launch(warp_grid, cuda::kBlock, 0, [&] { body(slots, full); });
    });
  } else {
    simt::launch(cuda::grid_for(rows), cuda::kBlock, 0,
                 [&] { body(std::integral_constant<int, 0>{}, std::false_type{}); });
  }
}

template <typename Out>
void forward(std::int64_t rows, std::int64_t n, const float* x, const float* x2, float* sum,
             const float* w, const float* b, Out* y, std::uint16_t* xb, float* mean, float* rstd) {
  // At most kBlocksCap blocks (a block is 256 fibers here): the rows loop round.
  const unsigned grid =
      std::min(kBlocksCap, cuda::grid_for((rows + cuda::kBlock / 32 - 1) / (cuda::kBlock / 32)));
  launch_rows(rows, n, grid, [&](auto slots, [[maybe_unused]] auto full) {
    constexpr int kSlots = decltype(slots)::value;
    if constexpr (kSlots > 0) {
      cuda::layer_norm_forward_rows_kernel<Out, kSlots, decltype(full)::value>(
          x, x2, sum, w, b, y, xb, mean, rstd, rows, n, kEps);
    } else {
      cuda::layer_norm_forward_kernel<false, Out>(x, x2, sum, w, b, y, xb, mean, rstd, rows, n,
                                                  kEps);
    }
  });
}

// The column partials' spans, norm.cu's choice.
std::int64_t span_rows_of(std::int64_t rows, std::int64_t n) {
  return n <= cuda::kWarpRowMax
             ? cuda::layer_norm_span_rows(rows)
             : std::max(cuda::kSpanRows, (rows + cuda::kMaxSpans - 1) / cuda::kMaxSpans);
}

// dx (null: none) and, with dw (then db too), the weight and bias gradients, as norm.cu launches
// them: the fused warp-rows kernel, or the block kernel and the column partials; then the sums.
template <typename X, typename G = float>
void backward(std::int64_t rows, std::int64_t n, const G* g, const X* x, const float* w,
              const float* mean, const float* rstd, float* dx, bool accumulate, float* dw = nullptr,
              float* db = nullptr, unsigned grid_cap = kBlocksCap, std::int64_t span_rows = 0,
              std::uint16_t* dxb = nullptr) {
  if (span_rows == 0) span_rows = span_rows_of(rows, n);
  const std::int64_t spans = (rows + span_rows - 1) / span_rows;
  std::vector<double> dw_part(dw ? static_cast<std::size_t>(spans * n) : 0),
      db_part(dw_part.size());
  double* pw = dw ? dw_part.data() : nullptr;
  double* pb = dw ? db_part.data() : nullptr;
  const unsigned grid = std::min(cuda::grid_for(spans), grid_cap);  // spans loop round
  launch_rows(rows, n, grid, [&](auto slots, [[maybe_unused]] auto full) {
    constexpr int kSlots = decltype(slots)::value;
    if constexpr (kSlots > 0) {
      cuda::layer_norm_backward_rows_kernel<X, G, kSlots, decltype(full)::value>(
          g, x, w, mean, rstd, dx, accumulate, dxb, pw, pb, rows, n, span_rows);
    } else if (dx != nullptr) {
      cuda::layer_norm_backward_kernel<false, X, G>(g, x, w, mean, rstd, dx, accumulate, dxb, rows,
                                                    n);
    }
  });
  if (dw == nullptr) return;
  if (n > cuda::kWarpRowMax) {
    simt::launch(static_cast<unsigned>((n + cuda::kBlock - 1) / cuda::kBlock),
                 static_cast<unsigned>(spans), cuda::kBlock, 0, [&] {
                   cuda::layer_norm_column_partials_kernel<X, G>(g, x, mean, rstd, pw, pb, rows, n,
                                                                 span_rows);
                 });
  }
  simt::launch(std::min(kBlocksCap, cuda::grid_for((n + 31) / 32)), cuda::kSpanSumThreads, 0,
               [&] { cuda::span_sums_kernel(pw, dw, pb, db, spans, n); });
}

void check_shape(std::int64_t rows, std::int64_t n) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " n " + std::to_string(n));
  Generator gen(static_cast<std::uint64_t>(rows * 7 + n));
  const Tensor x = Tensor::randn({rows, n}, gen, 0.5f, 2.0f), x2 = Tensor::randn({rows, n}, gen);
  const Tensor w = Tensor::randn({n}, gen), b = Tensor::randn({n}, gen);
  const Tensor gy = Tensor::randn({rows, n}, gen);
  const std::vector<float> xv = copy_of<float>(x), x2v = copy_of<float>(x2), wv = copy_of<float>(w),
                           bv = copy_of<float>(b), gv = copy_of<float>(gy);
  const auto count = static_cast<std::size_t>(rows * n), nr = static_cast<std::size_t>(rows);

  // Forward, f32.
  Tensor mean_want, rstd_want;
  const Tensor y_want = kernels::layer_norm_forward(x, n, w, b, kEps, mean_want, rstd_want);
  std::vector<float> y(count, -1.0f), mean(nr, -1.0f), rstd(nr, -1.0f);
  forward<float>(rows, n, xv.data(), nullptr, nullptr, wv.data(), bv.data(), y.data(), nullptr,
                 mean.data(), rstd.data());
  expect_close(y, y_want, 1e-5f, "y");
  expect_close(mean, mean_want, 1e-6f, "mean");
  expect_close(rstd, rstd_want, 1e-6f, "rstd");

  // Forward in bf16 with x's bf16 copy; and of a + b with the sum and its bf16 copy.
  Tensor xb_want;
  const Tensor yb_want =
      kernels::layer_norm_forward_bf16(x, n, w, b, kEps, mean_want, rstd_want, &xb_want);
  std::vector<std::uint16_t> yb(count, 0xffffu), xb(count, 0xffffu);
  forward<std::uint16_t>(rows, n, xv.data(), nullptr, nullptr, wv.data(), bv.data(), yb.data(),
                         xb.data(), mean.data(), rstd.data());
  expect_bf16_close(yb, yb_want, "y bf16");
  EXPECT_EQ(xb, copy_of<std::uint16_t>(xb_want)) << "x rounded";
  Tensor sum_want, sumb_want;
  const Tensor ys_want = kernels::add_layer_norm_forward_bf16(x, x2, n, w, b, kEps, sum_want,
                                                              mean_want, rstd_want, &sumb_want);
  std::vector<float> sum(count, -1.0f);
  forward<std::uint16_t>(rows, n, xv.data(), x2v.data(), sum.data(), wv.data(), bv.data(),
                         yb.data(), xb.data(), mean.data(), rstd.data());
  expect_bf16_close(yb, ys_want, "y of the sum");
  EXPECT_EQ(sum, copy_of<float>(sum_want)) << "sum";
  EXPECT_EQ(xb, copy_of<std::uint16_t>(sumb_want)) << "sum rounded";
  expect_close(mean, mean_want, 1e-6f, "mean of the sum");

  // Backward from the f32 forward's statistics: dx from f32 x with the weight and bias gradients
  // (norm.cu's column sums), the same sums without dx and with fewer blocks than spans, and dx
  // added into a gradient from a bf16 x.
  Tensor m32, r32;
  kernels::layer_norm_forward(x, n, w, b, kEps, m32, r32);
  const std::vector<float> mv = copy_of<float>(m32), rv = copy_of<float>(r32);
  Tensor dx_want, dw_want, db_want;
  kernels::layer_norm_backward(gy, x, n, w, m32, r32, &dx_want, &dw_want, &db_want);
  std::vector<float> dx(count, -1.0f), dw(static_cast<std::size_t>(n), -1.0f), db(dw);
  backward<float>(rows, n, gv.data(), xv.data(), wv.data(), mv.data(), rv.data(), dx.data(), false,
                  dw.data(), db.data());
  expect_close(dx, dx_want, 1e-5f, "dx");
  expect_close(dw, dw_want, 1e-5f, "dw");
  expect_close(db, db_want, 1e-5f, "db");
  std::fill(dw.begin(), dw.end(), -1.0f);
  std::fill(db.begin(), db.end(), -1.0f);
  backward<float>(rows, n, gv.data(), xv.data(), wv.data(), mv.data(), rv.data(), nullptr, false,
                  dw.data(), db.data(), 2);
  expect_close(dw, dw_want, 1e-5f, "dw without dx, two blocks");
  expect_close(db, db_want, 1e-5f, "db without dx, two blocks");
  // Spans of 20 rows (norm.cu's for more than 9728 rows): a warp takes two or three of each.
  backward<float>(rows, n, gv.data(), xv.data(), wv.data(), mv.data(), rv.data(), dx.data(), false,
                  dw.data(), db.data(), kBlocksCap, 20);
  expect_close(dx, dx_want, 1e-5f, "dx, spans of 20 rows");
  expect_close(dw, dw_want, 1e-5f, "dw, spans of 20 rows");
  const Tensor xb16 = kernels::to_bf16(x);
  const std::vector<std::uint16_t> xb16v = copy_of<std::uint16_t>(xb16);
  Tensor into = x2.clone();  // the gradient summed so far
  kernels::layer_norm_backward(gy, xb16, n, w, m32, r32, &into, nullptr, nullptr);
  std::vector<float> acc = x2v;
  backward<std::uint16_t>(rows, n, gv.data(), xb16v.data(), wv.data(), mv.data(), rv.data(),
                          acc.data(), true);
  expect_close(acc, into, 1e-5f, "dx added into a gradient, bf16 x");
  // And from a bf16 gradient (a bf16 product's input gradient) beside the bf16 x, with the weight
  // and bias gradients: the CPU's from the same bf16 gradient.
  const Tensor gy16 = kernels::to_bf16(gy);
  const std::vector<std::uint16_t> gy16v = copy_of<std::uint16_t>(gy16);
  into = x2.clone();
  kernels::layer_norm_backward(gy16, xb16, n, w, m32, r32, &into, &dw_want, &db_want);
  acc = x2v;
  backward<std::uint16_t, std::uint16_t>(rows, n, gy16v.data(), xb16v.data(), wv.data(), mv.data(),
                                         rv.data(), acc.data(), true, dw.data(), db.data());
  expect_close(acc, into, 1e-5f, "dx added into a gradient, bf16 x and gradient");
  expect_close(dw, dw_want, 1e-5f, "dw, bf16 x and gradient");
  expect_close(db, db_want, 1e-5f, "db, bf16 x and gradient");
  // With dx's bf16 copy written by the same pass: the sum's own rounding, bit for bit; and the
  // CPU's copy is the CPU's sum rounded.
  into = x2.clone();
  Tensor into_bf16;
  kernels::layer_norm_backward(gy16, xb16, n, w, m32, r32, &into, nullptr, nullptr, &into_bf16);
  EXPECT_EQ(copy_of<std::uint16_t>(into_bf16), copy_of<std::uint16_t>(kernels::to_bf16(into)));
  acc = x2v;
  std::vector<std::uint16_t> accb(count, 0xffffu);
  backward<std::uint16_t, std::uint16_t>(rows, n, gy16v.data(), xb16v.data(), wv.data(), mv.data(),
                                         rv.data(), acc.data(), true, nullptr, nullptr, kBlocksCap,
                                         0, accb.data());
  expect_close(acc, into, 1e-5f, "dx added into a gradient, with its bf16 copy");
  EXPECT_EQ(accb, copy_of<std::uint16_t>(kernels::to_bf16(Tensor::from(acc, {rows, n}))))
      << "the bf16 copy is the sum rounded";
}

// Each slot count norm.cu picks, the last slot partly used or not; spans of 8 to 64 rows.
TEST(LayerNormEmulated, WarpRowsMatchTheCpu) {
  check_shape(150, 96);  // 4 slots; 19 spans of 8 rows, the last short
  check_shape(40, 300);  // 12, the last partly used
  check_shape(24, 768);  // 24, filled (GPT-2's width)
  check_shape(9, 1000);  // 32
  check_shape(30, 256);  // 8, filled: no masks
}

// norm.cu's spans for the warp rows: about 512 of 8 to 64 rows, no more than kMaxSpans.
TEST(LayerNormEmulated, SpansOfRows) {
  EXPECT_EQ(cuda::layer_norm_span_rows(100), 8);
  EXPECT_EQ(cuda::layer_norm_span_rows(16384), 32);  // GPT-2 small's batch: 512 spans
  EXPECT_EQ(cuda::layer_norm_span_rows(1 << 20), 64);
  EXPECT_EQ(cuda::layer_norm_span_rows(std::int64_t{1} << 23), 129);  // 65029 spans
}

TEST(LayerNormEmulated, BlockRowsMatchTheCpu) { check_shape(5, 1500); }

}  // namespace
}  // namespace hpm
