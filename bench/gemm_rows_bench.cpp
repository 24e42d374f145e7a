// Why micro-batches cost more than the batch they split (BENCHMARKS.md, pipeline section): a
// Linear's three GEMMs (forward x W^T, dX = dY W, dW += dY^T x) for 1024 x 1024 weights, timed
// at 2048 rows and at 256 and 64 rows, scaled to 2048 rows' worth, through hpm's cpu::gemm;
// next to them dX straight through oneDNN's dnnl_sgemm, which short products run at half speed
// when B's rows are 4 KiB apart (cpu::gemm copies B to padded rows then). One kernel thread.
//   build/bench/gemm_rows_bench [rounds]
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "hpm/tensor/backend/cpu.h"
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
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace
int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  set_num_threads(1);
  Generator g(1);
  std::printf("ms per 2048 rows' worth, medians of %d rounds, 1024 x 1024 weights, one thread\n\n",
              rounds);
  std::printf(
      "| rows per call | dW += dY^T x | dX = dY W | dX, dnnl_sgemm as is | forward x W^T |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int rows : {2048, 256, 64}) {
    Tensor gy = Tensor::randn({rows, 1024}, g), x = Tensor::randn({rows, 1024}, g),
           w = Tensor::randn({1024, 1024}, g);
    Tensor c = Tensor::zeros({1024, 1024}), dx = Tensor::zeros({rows, 1024});
    const int reps = 2048 / rows * 2;
    const double scale = 2048.0 / rows;
    std::vector<double> dw, dx_hpm, dx_raw, fw;
    for (int r = 0; r < rounds; ++r) {
      dw.push_back(scale * t(
                               [&] {
                                 cpu::gemm(true, false, 1024, 1024, rows, 1, gy.data<float>(),
                                               1024, x.data<float>(), 1024, 1, c.data<float>(),
                                               1024);
                               },
                               reps));
      dx_hpm.push_back(scale * t(
                                   [&] {
                                     cpu::gemm(false, false, rows, 1024, 1024, 1,
                                                   gy.data<float>(), 1024, w.data<float>(), 1024, 0,
                                                   dx.data<float>(), 1024);
                                   },
                                   reps));
      dx_raw.push_back(scale * t(
                                   [&] {
                                     dnnl_sgemm('N', 'N', rows, 1024, 1024, 1, gy.data<float>(),
                                                1024, w.data<float>(), 1024, 0, dx.data<float>(),
                                                1024);
                                   },
                                   reps));
      fw.push_back(scale * t([&] { Tensor y = kernels::matmul(x, w, false, true); }, reps));
    }
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f |\n", rows, median(dw), median(dx_hpm),
                median(dx_raw), median(fw));
  }
}
