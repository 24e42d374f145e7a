#include "tensor/backend/cuda/deferred_checks.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

// Reads the words of the pending checks; the caller holds checks_mu and the stream is drained.
void raise_locked(Context& c) {
  const std::size_t n = c.checks.size();
  if (n == 0) return;
  std::vector<unsigned long long> words(n);
  HPM_CUDA_CHECK(cudaMemcpy(words.data(), c.check_words, n * sizeof(unsigned long long),
                            cudaMemcpyDeviceToHost));
  std::vector<PendingCheck> checks = std::move(c.checks);
  c.checks.clear();
  // Cleared for the next checks, in stream order before any kernel that uses them.
  HPM_CUDA_CHECK(cudaMemsetAsync(c.check_words, 0xff, n * sizeof(unsigned long long), c.compute));
  for (std::size_t i = 0; i < n; ++i) {
    if (words[i] == kNoError) continue;
    const auto position = static_cast<std::int64_t>(words[i]);
    std::int64_t value = 0;
    HPM_CUDA_CHECK(cudaMemcpy(&value, ptr<std::int64_t>(checks[i].values) + position, sizeof(value),
                              cudaMemcpyDeviceToHost));
    throw std::out_of_range(checks[i].describe(position, value));
  }
}

}  // namespace

unsigned long long* defer_index_check(
    Context& c, const Tensor& values,
    std::function<std::string(std::int64_t position, std::int64_t value)> describe) {
  std::lock_guard lock(c.checks_mu);
  if (c.checks.size() == static_cast<std::size_t>(Context::kMaxChecks)) {
    HPM_CUDA_CHECK(cudaStreamSynchronize(c.compute));
    raise_locked(c);
  }
  c.checks.push_back(PendingCheck{values, std::move(describe)});
  return c.check_words + (c.checks.size() - 1);
}

void raise_failed_checks(Context& c) {
  std::lock_guard lock(c.checks_mu);
  raise_locked(c);
}

}  // namespace hpm::cuda
