// Why micro-batches cost more than the batch they split (BENCHMARKS.md, pipeline section): a
// Linear's three GEMMs (forward x W^T, dX = dY W, dW += dY^T x) for 1024 x 1024 weights, timed
// at 2048 rows and at 256 and 64 rows, scaled to 2048 rows' worth. One kernel thread.
//   build/bench/gemm_rows_bench
#include <chrono>
#include <cstdio>
#include <vector>

#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"
using namespace hpm;
namespace {
double t(auto f, int reps) {
  f();
  auto a = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count() /
         reps;
}
}  // namespace
int main() {
  set_num_threads(1);
  Generator g(1);
  for (int rows : {2048, 256, 64}) {
    Tensor gy = Tensor::randn({rows, 1024}, g), x = Tensor::randn({rows, 1024}, g),
           w = Tensor::randn({1024, 1024}, g);
    Tensor c = Tensor::zeros({1024, 1024});
    int reps = 2048 / rows * 2;
    double dw0 = t(
        [&] {
          kernels::gemm(true, false, 1024, 1024, rows, 1, gy.data<float>(), 1024, x.data<float>(),
                        1024, 0, c.data<float>(), 1024);
        },
        reps);
    double dw1 = t(
        [&] {
          kernels::gemm(true, false, 1024, 1024, rows, 1, gy.data<float>(), 1024, x.data<float>(),
                        1024, 1, c.data<float>(), 1024);
        },
        reps);
    double dx = t([&] { Tensor r = kernels::matmul(gy, w); }, reps);
    double fw = t([&] { Tensor r = kernels::matmul(x, w, false, true); }, reps);
    std::printf(
        "rows %4d: dW beta0 %.2f ms beta1 %.2f ms, dX %.2f ms, fwd %.2f ms  (x%d per 2048 rows: "
        "dW1 %.1f dX %.1f fwd %.1f)\n",
        rows, dw0, dw1, dx, fw, 2048 / rows, dw1 * 2048 / rows, dx * 2048 / rows, fw * 2048 / rows);
  }
}
