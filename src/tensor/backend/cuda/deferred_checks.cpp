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

IndexCheck::~IndexCheck() {
  std::lock_guard lock(c_->checks_mu);
  const std::thread::id me = std::this_thread::get_id();
  for (PendingCheck& check : c_->checks) {
    if (check.word == word_ && check.thread == me) check.launched = true;
  }
}

IndexCheck defer_index_check(
    Context& c, const Tensor& values,
    std::function<std::string(std::int64_t position, std::int64_t value)> describe) {
  std::unique_lock lock(c.checks_mu);
  const std::thread::id me = std::this_thread::get_id();
  // A check another thread has registered but not launched yet stays: its word is not written.
  const auto readable = [me](const PendingCheck& check) {
    return check.launched || check.thread == me;
  };
  auto* free_word = std::find(std::begin(c.check_word_used), std::end(c.check_word_used), false);
  while (free_word == std::end(c.check_word_used)) {
    if (std::any_of(c.checks.begin(), c.checks.end(), readable)) {
      // Every word pending: wait for the device, then read the launched ones, whoever issued
      // them.
      HPM_CUDA_CHECK(cudaStreamSynchronize(c.compute));
      raise_locked(c, readable);
    } else {
      // Every word held by other threads' launches under way: let them finish.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    free_word = std::find(std::begin(c.check_word_used), std::end(c.check_word_used), false);
  }
  *free_word = true;
  const auto word = static_cast<int>(free_word - std::begin(c.check_word_used));
  c.checks.push_back(PendingCheck{values, std::move(describe), word, me, false});
  return IndexCheck(c, word);
}

void raise_failed_checks(Context& c) {
  std::lock_guard lock(c.checks_mu);
  const std::thread::id me = std::this_thread::get_id();
  raise_locked(c, [me](const PendingCheck& check) { return check.thread == me; });
}

}  // namespace hpm::cuda
