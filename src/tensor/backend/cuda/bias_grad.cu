// bias_grad.h's launches.
#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "tensor/backend/cuda/bias_grad.h"
#include "tensor/backend/cuda/bias_grad_kernels.cuh"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

void bias_grad(const Tensor& g, Tensor& db) {
  if (g.dim() != 2 || db.numel() != g.size(1) || db.dtype() != DType::F32) {
    throw std::invalid_argument("bias_grad: " + g.shape().str() + " into " + db.shape().str());
  }
  const std::int64_t rows = g.size(0), cols = g.size(1);
  if (cols == 0) return;
  const std::int64_t span_rows =
      std::max(kBiasGradSpanRows, (rows + kBiasGradSpans - 1) / kBiasGradSpans);
  const std::int64_t spans = (rows + span_rows - 1) / span_rows;  // 0 without rows: zeros
  Tensor partial = Tensor::empty({std::max<std::int64_t>(spans, 1) * cols}, DType::F64);
  cudaStream_t stream = current_stream();
  if (spans > 0) {
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(spans));
    if (g.dtype() == DType::BF16) {
      bias_grad_partials_kernel<<<grid, kBiasGradThreads, 0, stream>>>(
          ptr<std::uint16_t>(g), ptr<double>(partial), rows, cols, span_rows);
    } else {
      bias_grad_partials_kernel<<<grid, kBiasGradThreads, 0, stream>>>(
          ptr<float>(g), ptr<double>(partial), rows, cols, span_rows);
    }
    HPM_CUDA_LAUNCH_CHECK("bias_grad_partials_kernel");
  }
  span_sums_kernel<<<grid_for((cols + 31) / 32), kSpanSumThreads, 0, stream>>>(
      ptr<double>(partial), ptr<float>(db), nullptr, nullptr, spans, cols);
  HPM_CUDA_LAUNCH_CHECK("span_sums_kernel");
}

}  // namespace hpm::cuda
