// What a Linear's kernels (f32 in gemm.cpp, bf16 in bf16.cpp) share: the checked shapes and an
// output seeded with the bias.
#pragma once
#include "hpm/tensor/tensor.h"

namespace hpm::cpu {

// y (n, out) for x (n, in) and w (out, in), holding the bias in every row when there is one so
// that the GEMM adds into it (one pass over y instead of two): beta is 1 then, else 0. Throws
// std::invalid_argument naming both shapes when they do not match.
struct LinearOutput {
  Tensor y;
  float beta;
};
LinearOutput linear_output(const Tensor& x, const Tensor& w, const Tensor& bias);

}  // namespace hpm::cpu
