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

// Frees the pending checks that `mine` selects, judged by `words` (the check words as copied
// after their kernels ran), and throws for the first that failed. The caller holds checks_mu.
template <typename Mine>
void settle_locked(Context& c, Mine mine, const unsigned long long* words) {
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

// Reads the words of the pending checks that `mine` selects, whose kernels the stream has run,
// frees them and throws for the first that failed. The caller holds checks_mu.
template <typename Mine>
void raise_locked(Context& c, Mine mine) {
  if (std::none_of(c.checks.begin(), c.checks.end(), mine)) return;
  unsigned long long words[Context::kMaxChecks];
  HPM_CUDA_CHECK(cudaMemcpy(words, c.check_words, sizeof(words), cudaMemcpyDeviceToHost));
  settle_locked(c, mine, words);
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
  c.checks.push_back(PendingCheck{values, std::move(describe), word, me, false, c.next_check_id++});
  return IndexCheck(c, word);
}

void raise_failed_checks(Context& c) {
  std::lock_guard lock(c.checks_mu);
  const std::thread::id me = std::this_thread::get_id();
  raise_locked(c, [me](const PendingCheck& check) { return check.thread == me; });
}

}  // namespace hpm::cuda

namespace hpm::cuda {

std::vector<CheckRef> checks_of_this_thread(Context& c) {
  std::lock_guard lock(c.checks_mu);
  const std::thread::id me = std::this_thread::get_id();
  std::vector<CheckRef> refs;
  for (const PendingCheck& check : c.checks)
    if (check.thread == me) refs.push_back(CheckRef{check.id, check.word});
  return refs;
}

void settle_checks(Context& c, const std::vector<CheckRef>& refs, const unsigned long long* words) {
  if (refs.empty()) return;
  std::lock_guard lock(c.checks_mu);
  // Those a synchronous read settled meanwhile are gone (their words may hold newer checks).
  settle_locked(
      c,
      [&](const PendingCheck& check) {
        return std::any_of(refs.begin(), refs.end(),
                           [&](const CheckRef& r) { return r.id == check.id; });
      },
      words);
}

}  // namespace hpm::cuda
