#include "hpm/autograd/deferred.h"

namespace hpm::autograd {

namespace {
thread_local DeferredWeightGradients* current = nullptr;
}  // namespace

void DeferredWeightGradients::run() {
  // Taken out first: work that throws leaves no half-run queue behind.
  std::vector<std::function<void()>> work;
  work.swap(work_);
  for (auto& w : work) w();
}

DeferWeightGradients::DeferWeightGradients(DeferredWeightGradients& into) : previous_(current) {
  current = &into;
}

DeferWeightGradients::~DeferWeightGradients() { current = previous_; }

DeferredWeightGradients* deferred_weight_gradients() { return current; }

}  // namespace hpm::autograd
