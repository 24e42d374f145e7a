// A Linear's bias gradient, the column sums of its output gradient (rows x cols, F32 or BF16), into
// db (cols, F32), deterministic (bias_grad_kernels.cuh), on the current device's stream: for
// products whose bias gradient cuBLASLt's epilogue does not compute.
#pragma once
#include "hpm/tensor/tensor.h"

namespace hpm::cuda {
void bias_grad(const Tensor& g, Tensor& db);
}  // namespace hpm::cuda
