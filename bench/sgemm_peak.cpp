// The practical FP32 peak of this machine: oneDNN SGEMM on a large square problem and on the
// mlp's shapes, median GFLOP/s over repeats. Prints one JSON line; bench/fmnist_vs_torch.py uses it
// as the physical limit to compare hpm's training FLOP rate against.
//   build/bench/sgemm_peak [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "hpm/tensor/device.h"
#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace {
double median_gflops(std::int64_t m, std::int64_t n, std::int64_t k, int repeats) {
  hpm::Generator gen(1);
  hpm::Tensor a = hpm::Tensor::randn({m, k}, gen), b = hpm::Tensor::randn({k, n}, gen),
              c = hpm::Tensor::zeros({m, n});
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const int inner = std::max<int>(1, static_cast<int>(2e9 / (2.0 * m * n * k)));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i)
      hpm::cpu::gemm(false, false, m, n, k, 1.0f, a.data<float>(), k, b.data<float>(), n, 0.0f,
                         c.data<float>(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * m * n * k * inner / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  hpm::set_num_threads(threads);
  const double square = median_gflops(1024, 1024, 1024, 7);
  const double mlp = median_gflops(64, 512, 784, 7);
  std::printf("{\"threads\": %d, \"sgemm_1024_gflops\": %.1f, \"sgemm_64x784x512_gflops\": %.1f}\n",
              threads, square, mlp);
  return 0;
}
