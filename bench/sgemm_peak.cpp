// The practical peaks of this machine, the physical limits the benches compare hpm's rates to:
// oneDNN SGEMM on a large square problem and on the mlp's shapes, the bf16 GEMM (bf16 operands,
// f32 accumulation: what [train] precision = "bf16" multiplies with) on the square problem, and
// memcpy bandwidth. Medians over repeats of at least 0.2 s each, so that a busy neighbour pulls
// one repeat down, not the median. Prints one JSON line (bench/fmnist_vs_torch.py,
// bench/gpt_vs_torch.py and bench/vs_best_torch.py read it).
//   build/bench/sgemm_peak [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median over `repeats` of units per second, each repeat running `once` (worth `units`) as many
// times as fill 0.2 s.
double median_rate(const std::function<void()>& once, double units, int repeats) {
  once();  // warm: first-touch pages, oneDNN's kernel generation
  const auto t0 = Clock::now();
  once();
  const double one = std::chrono::duration<double>(Clock::now() - t0).count();
  const int inner = std::max(1, static_cast<int>(0.2 / std::max(one, 1e-9)));
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < inner; ++i) once();
    rates.push_back(units * inner / std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

double sgemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k) {
  hpm::Generator gen(1);
  hpm::Tensor a = hpm::Tensor::randn({m, k}, gen), b = hpm::Tensor::randn({k, n}, gen),
              c = hpm::Tensor::zeros({m, n});
  return median_rate(
             [&] {
               hpm::cpu::gemm(false, false, m, n, k, 1.0f, a.data<float>(), k, b.data<float>(), n,
                              0.0f, c.data<float>(), n);
             },
             2.0 * m * n * k, 7) /
         1e9;
}

double bf16_gemm_gflops(std::int64_t m, std::int64_t n, std::int64_t k) {
  hpm::Generator gen(1);
  const hpm::Tensor a32 = hpm::Tensor::randn({m, k}, gen), b32 = hpm::Tensor::randn({k, n}, gen);
  std::vector<std::uint16_t> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
  hpm::cpu::f32_to_bf16(a32.data<float>(), a.data(), m * k);
  hpm::cpu::f32_to_bf16(b32.data<float>(), b.data(), k * n);
  hpm::Tensor c = hpm::Tensor::zeros({m, n});
  return median_rate(
             [&] {
               hpm::cpu::gemm_bf16(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
                                   c.data<float>(), n);
             },
             2.0 * m * n * k, 7) /
         1e9;
}

// Bytes copied per second by `threads` threads, each copying its part of a 256 MiB buffer.
double memcpy_gbytes_per_s(int threads) {
  const std::size_t bytes = std::size_t{256} << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  return median_rate(
             [&] {
               std::vector<std::thread> pool;
               const std::size_t part = bytes / static_cast<std::size_t>(threads);
               for (int t = 0; t < threads; ++t) {
                 pool.emplace_back([&, t] {
                   const std::size_t at = part * static_cast<std::size_t>(t);
                   std::memcpy(to.data() + at, from.data() + at, part);
                 });
               }
               for (auto& p : pool) p.join();
             },
             static_cast<double>(bytes), 7) /
         1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  hpm::set_num_threads(threads);
  const double square = sgemm_gflops(1024, 1024, 1024);
  const double mlp = sgemm_gflops(64, 512, 784);
  // Without AVX512_BF16 oneDNN emulates bf16 products: no peak of this machine to compare with.
  char bf16[32] = "null";
  if (hpm::cpu::native_bf16())
    std::snprintf(bf16, sizeof bf16, "%.1f", bf16_gemm_gflops(1024, 1024, 1024));
  const double memcpy_rate = memcpy_gbytes_per_s(threads);
  std::printf(
      "{\"threads\": %d, \"sgemm_1024_gflops\": %.1f, \"sgemm_64x784x512_gflops\": %.1f, "
      "\"bf16_gemm_1024_gflops\": %s, \"memcpy_gbytes_per_s\": %.2f}\n",
      threads, square, mlp, bf16, memcpy_rate);
  return 0;
}
