#include "tensor/backend/cuda/deferred_checks.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

// Reads the words of the pending checks that `mine` selects, whose kernels the stream has run,
// frees them and throws for the first that failed. The caller holds checks_mu.
template <typename Mine>
void raise_locked(Context& c, Mine mine) {
  if (std::none_of(c.checks.begin(), c.checks.end(), mine)) return;
  unsigned long long words[Context::kMaxChecks];
  HPM_CUDA_CHECK(cudaMemcpy(words, c.check_words, sizeof(words), cudaMemcpyDeviceToHost));
  std::optional<PendingCheck> failed;
  std::vector<PendingCheck> kept;
  for (PendingCheck& check : c.checks) {
    if (!mine(check)) {
      kept.push_back(std::move(check));
      continue;
    }
    if (!failed && words[check.word] != kNoError) failed = check;
    // Cleared for its next check, in stream order before any kernel that uses it.
    if (words[check.word] != kNoError) {
      HPM_CUDA_CHECK(
          cudaMemsetAsync(c.check_words + check.word, 0xff, sizeof(unsigned long long), c.compute));
    }
    c.check_word_used[check.word] = false;
  }
  c.checks = std::move(kept);
  if (!failed) return;
  const auto position = static_cast<std::int64_t>(words[failed->word]);
  std::int64_t value = 0;
  HPM_CUDA_CHECK(cudaMemcpy(&value, ptr<std::int64_t>(failed->values) + position, sizeof(value),
                            cudaMemcpyDeviceToHost));
  throw std::out_of_range(failed->describe(position, value));
}

}  // namespace

unsigned long long* defer_index_check(
    Context& c, const Tensor& values,
    std::function<std::string(std::int64_t position, std::int64_t value)> describe) {
  std::lock_guard lock(c.checks_mu);
  auto* free_word = std::find(std::begin(c.check_word_used), std::end(c.check_word_used), false);
  if (free_word == std::end(c.check_word_used)) {
    // Every word pending: wait for the device, then read them all, whoever issued them.
    HPM_CUDA_CHECK(cudaStreamSynchronize(c.compute));
    raise_locked(c, [](const PendingCheck&) { return true; });
    free_word = std::begin(c.check_word_used);
  }
  *free_word = true;
  const auto word = static_cast<int>(free_word - std::begin(c.check_word_used));
  c.checks.push_back(PendingCheck{values, std::move(describe), word, std::this_thread::get_id()});
  return c.check_words + word;
}

void raise_failed_checks(Context& c) {
  std::lock_guard lock(c.checks_mu);
  const std::thread::id me = std::this_thread::get_id();
  raise_locked(c, [me](const PendingCheck& check) { return check.thread == me; });
}

}  // namespace hpm::cuda
