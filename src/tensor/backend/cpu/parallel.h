// Intra-op parallelism: split [0, n) into one contiguous chunk per OpenMP thread when the work is
// large enough to pay for waking them (oneDNN shares the same OpenMP pool).
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace hpm::cpu {

template <typename F>
void parallel_for(std::int64_t n, std::int64_t grain, F&& f) {
  if (n <= grain || omp_in_parallel() || omp_get_max_threads() == 1) {
    f(std::int64_t{0}, n);
    return;
  }
  const int max_threads =
      static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), (n + grain - 1) / grain));
#pragma omp parallel num_threads(max_threads)
  {
    const std::int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const std::int64_t chunk = (n + nt - 1) / nt;
    const std::int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) f(begin, end);
  }
}

constexpr std::int64_t kElementwiseGrain = 1 << 15;

}  // namespace hpm::cpu
