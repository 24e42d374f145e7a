// Linear's output seeded with its bias, for the product to add into (blas_ops.cpp).
#include "tensor/backend/cuda/bias_rows.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {
__global__ void bias_rows_kernel(float* y, const float* bias, std::int64_t rows,
                                 std::int64_t cols) {
  const std::int64_t total = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] = bias[i % cols];
  }
}
}  // namespace

void bias_rows(float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  if (rows * cols == 0) return;
  bias_rows_kernel<<<blocks_for(rows * cols), 256, 0, current_stream()>>>(y, bias, rows, cols);
  HPM_CUDA_LAUNCH_CHECK("bias_rows");
}

}  // namespace hpm::cuda
