#include "hpm/autograd/deferred.h"

namespace hpm::autograd {

namespace {
thread_local DeferredWeightGradients* active_deferral = nullptr;
}  // namespace

void DeferredWeightGradients::run() {
  // Taken out first: work that throws leaves no half-run queue behind.
  std::vector<std::function<void()>> work;
  work.swap(work_);
  for (auto& w : work) w();
}

DeferWeightGradients::DeferWeightGradients(DeferredWeightGradients& into)
    : previous_(active_deferral) {
  active_deferral = &into;
}

DeferWeightGradients::~DeferWeightGradients() { active_deferral = previous_; }

DeferredWeightGradients* deferred_weight_gradients() { return active_deferral; }

}  // namespace hpm::autograd
