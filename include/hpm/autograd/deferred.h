// Deferred weight gradients, for zero-bubble pipeline schedules (Qi et al. 2023): a backward pass
// splits into the input gradient (B), which the previous pipeline stage waits for, and the weight
// gradient (W), which nobody waits for and can fill a stage's idle time later.
//
//   autograd::DeferredWeightGradients w;
//   {
//     autograd::DeferWeightGradients guard(w);
//     loss.backward();          // B: input gradients only, for the layers that can split
//   }
//   w.run();                    // W: the weight gradients, accumulated into .grad as usual
//
// While a guard is alive on a thread, the Linear rule queues its weight and bias gradients (the
// closure keeps the output gradient and the input it needs) instead of computing them; other
// rules compute everything in B as before. run() adds exactly what backward would have added,
// through the leaf's accumulator (hooks included), so B followed by W equals one backward.
// A weight that is not a leaf (computed from something else) is never deferred.
#pragma once
#include <functional>
#include <vector>

namespace hpm::autograd {

class DeferredWeightGradients {
 public:
  void push(std::function<void()> work) { work_.push_back(std::move(work)); }
  // Runs and drops the queued work in the order it was queued.
  void run();
  bool empty() const { return work_.empty(); }
  std::size_t size() const { return work_.size(); }

 private:
  std::vector<std::function<void()>> work_;
};

class DeferWeightGradients {
 public:
  explicit DeferWeightGradients(DeferredWeightGradients& into);
  ~DeferWeightGradients();
  DeferWeightGradients(const DeferWeightGradients&) = delete;
  DeferWeightGradients& operator=(const DeferWeightGradients&) = delete;

 private:
  DeferredWeightGradients* previous_;
};

// The calling thread's queue while a DeferWeightGradients guard is alive, else null.
DeferredWeightGradients* deferred_weight_gradients();

}  // namespace hpm::autograd
