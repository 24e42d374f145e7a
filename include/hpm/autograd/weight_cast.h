// The bf16 copies of parameters that products take under bf16 autocast, made once a step: inside
// a WeightCastScope (a training step's forwards and backwards, where no parameter changes: the
// optimizer updates them after it) a parameter's first conversion is kept and every later use
// (its backward's product, a tied weight's other use, the next micro-batch, a recomputation)
// takes the same tensor, as torch.autocast's cast cache does. Outside a scope each use converts.
// The copies live until the scope ends: a step holds its parameters' bf16 bytes (half their f32
// bytes) from its first product to its end. At a scope's first request, every parameter that the
// last scope beginning with the same parameter asked for is converted at once (to_bf16_many: one
// launch on a GPU, where a GPT-2 small step made 73), so a parameter must not change from the
// scope's first product on (the optimizer's step comes after the scope, as before).
#pragma once
#include "hpm/tensor/tensor.h"

namespace hpm::autograd {

// w rounded to bf16: from the scope's cache when w is a parameter (an F32 leaf that requires
// grad) and a scope is open on this thread; otherwise kernels::to_bf16(w).
Tensor bf16_parameter(const Tensor& w);

// Opens the calling thread's cache (nests: an inner scope shares the outer one's) and drops it
// when the outermost scope ends.
class WeightCastScope {
 public:
  WeightCastScope();
  ~WeightCastScope();
  WeightCastScope(const WeightCastScope&) = delete;
  WeightCastScope& operator=(const WeightCastScope&) = delete;

 private:
  bool outermost_;
};

}  // namespace hpm::autograd
