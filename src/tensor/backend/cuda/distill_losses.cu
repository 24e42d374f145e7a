// The distillation losses: nll_loss over log-probabilities and kl_div (batchmean), softmax.cpp's
// formulas. The forwards sum in double as the CPU's (which sums on the host in double), in a fixed
// order: strided per-thread partials and then the block's tree (kl_div first sums fixed chunks of
// the input, one block each, then the chunks in order), so the result is the same run to run. The
// backwards read the upstream 0-d gradient on the device.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tensor/backend/cuda/deferred_checks.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"
#include "tensor/backend/cuda/vision_ops.h"

namespace hpm::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kReduceBlock = 1024;       // the one-block reductions
constexpr std::int64_t kKlChunk = 8192;  // values one block of kl_div's first stage sums

void expect_grad(const Tensor& grad, const char* op) {
  if (grad.numel() != 1 || grad.dtype() != DType::F32) {
    throw std::invalid_argument(std::string(op) + ": expected a one-element F32 grad, got " +
                                grad.shape().str() + " " + dtype_name(grad.dtype()));
  }
}

// One block: loss = -sum_i log_probs[i, labels[i]] / n in double. A label outside [0, c) records
// its row in *error (the smallest such row wins: atomicMin's result does not depend on the order,
// and the CPU throws at the first) and is not read through.
__global__ void nll_loss_forward_kernel(const float* __restrict__ log_probs,
                                        const std::int64_t* __restrict__ labels, std::int64_t n,
                                        std::int64_t c, unsigned long long* __restrict__ error,
                                        float* __restrict__ loss) {
  double total = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const std::int64_t y = labels[i];
    if (y < 0 || y >= c) {
      atomicMin(error, static_cast<unsigned long long>(i));
      continue;
    }
    total -= log_probs[i * c + y];
  }
  total = block_sum(total);
  // n == 0: 0 / 0 is NaN, as the CPU's.
  if (threadIdx.x == 0) *loss = static_cast<float>(total / static_cast<double>(n));
}

// d loss / d log_probs: -grad / n at each row's label, 0 elsewhere (a gather: every element
// written). A label outside [0, c) marks nothing.
__global__ void nll_loss_backward_kernel(const float* __restrict__ grad,
                                         const std::int64_t* __restrict__ labels,
                                         float* __restrict__ gx, std::int64_t n, std::int64_t c) {
  const float v = __fdiv_rn(-*grad, static_cast<float>(n));
  const std::int64_t total = n * c;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const std::int64_t i = e / c, j = e - i * c;
    gx[e] = labels[i] == j ? v : 0.0f;
  }
}

// kl_div's first stage: block b sums t (log t - x) over values [b kKlChunk, (b + 1) kKlChunk) in
// double, the terms with t != 0 only (t = 0 counts 0; a NaN or negative t makes it NaN, as on the
// CPU).
__global__ void kl_div_partials_kernel(const float* __restrict__ x, const float* __restrict__ t,
                                       double* __restrict__ partials, std::int64_t total) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * kKlChunk;
  const std::int64_t last = first + kKlChunk < total ? first + kKlChunk : total;
  double s = 0.0;
  for (std::int64_t i = first + threadIdx.x; i < last; i += blockDim.x) {
    const float ti = t[i];
    if (ti != 0.0f) {  // NaN and negative targets give NaN, as the CPU's and torch's xlogy
      const auto td = static_cast<double>(ti);
      s += td * (log(td) - static_cast<double>(x[i]));
    }
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// The second stage, one block: the partials' sum divided by the batch, into the 0-d loss.
__global__ void kl_div_total_kernel(const double* __restrict__ partials, std::int64_t count,
                                    double batch, float* __restrict__ loss) {
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *loss = static_cast<float>(s / batch);
}

// scale = grad / batch; d/dx = -scale t; d/dt = scale (log t + 1 - x) where t != 0, else 0 (in
// float, as the CPU's). Either output may be null.
__global__ void kl_div_backward_kernel(const float* __restrict__ grad, const float* __restrict__ x,
                                       const float* __restrict__ t, float* __restrict__ grad_input,
                                       float* __restrict__ grad_target, std::int64_t total,
                                       float batch) {
  const float scale = __fdiv_rn(*grad, batch);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const float ti = t[i];
    if (grad_input != nullptr) grad_input[i] = __fmul_rn(ti, -scale);
    if (grad_target != nullptr) {
      grad_target[i] =
          ti != 0.0f ? __fmul_rn(scale, __fsub_rn(__fadd_rn(logf(ti), 1.0f), x[i])) : 0.0f;
    }
  }
}

// softmax.cpp's batch_of: the first dimension, 1 for a 0-d input.
float batch_of(const Tensor& x) { return static_cast<float>(x.dim() > 0 ? x.size(0) : 1); }

}  // namespace

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& labels) {
  if (log_probs.dim() != 2 || labels.dim() != 1 || labels.size(0) != log_probs.size(0)) {
    throw std::invalid_argument("nll_loss: expected (N,C) and (N), got " + log_probs.shape().str() +
                                " and " + labels.shape().str());
  }
  require_dtype(log_probs, DType::F32);
  require_dtype(labels, DType::I64);
  const std::int64_t n = log_probs.size(0), c = log_probs.size(1);
  Tensor loss = Tensor::empty(Shape{}, DType::F32, log_probs.device());
  cudaStream_t stream = current_stream();
  const IndexCheck check =
      defer_index_check(current_context(), labels, [c](std::int64_t row, std::int64_t label) {
        return "nll_loss: label " + std::to_string(label) + " at row " + std::to_string(row) +
               " out of range [0, " + std::to_string(c) + ")";
      });
  unsigned long long* perr = check.word();
  const auto* py = ptr<std::int64_t>(labels);
  nll_loss_forward_kernel<<<1, kReduceBlock, 0, stream>>>(ptr<float>(log_probs), py, n, c, perr,
                                                          ptr<float>(loss));
  HPM_CUDA_LAUNCH_CHECK("nll_loss_forward_kernel");
  // A bad label is reported at the host's next read from the device (deferred_checks.h).
  return loss;
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& labels, const Shape& shape) {
  expect_grad(grad, "nll_loss_backward");
  // The CPU reads labels[0, N) and writes rows of shape[1] unchecked; here a mismatch is an error.
  if (shape.rank() != 2 || labels.dim() != 1 || labels.size(0) != shape[0]) {
    throw std::invalid_argument(
        "nll_loss_backward: expected a gradient of (N,C) and labels (N), got " + shape.str() +
        " and " + labels.shape().str());
  }
  require_dtype(labels, DType::I64);
  Tensor gx = Tensor::empty(shape, DType::F32, grad.device());
  const std::int64_t n = shape[0], c = shape[1];
  if (n * c == 0) return gx;
  nll_loss_backward_kernel<<<blocks_for(n * c, kBlock), kBlock, 0, current_stream()>>>(
      ptr<float>(grad), ptr<std::int64_t>(labels), ptr<float>(gx), n, c);
  HPM_CUDA_LAUNCH_CHECK("nll_loss_backward_kernel");
  return gx;
}

Tensor kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs) {
  check_shape(target_probs, input_log_probs.shape(), "kl_div: target");
  require_dtype(input_log_probs, DType::F32);
  require_dtype(target_probs, DType::F32);
  const std::int64_t total = input_log_probs.numel();
  const std::int64_t chunks = (total + kKlChunk - 1) / kKlChunk;
  Tensor loss = Tensor::empty(Shape{}, DType::F32, input_log_probs.device());
  Tensor partials = Tensor::empty({chunks > 0 ? chunks : 1}, DType::F64, input_log_probs.device());
  cudaStream_t stream = current_stream();
  if (chunks > 0) {
    kl_div_partials_kernel<<<static_cast<unsigned>(chunks), kBlock, 0, stream>>>(
        ptr<float>(input_log_probs), ptr<float>(target_probs), ptr<double>(partials), total);
    HPM_CUDA_LAUNCH_CHECK("kl_div_partials_kernel");
  }
  kl_div_total_kernel<<<1, kReduceBlock, 0, stream>>>(
      ptr<double>(partials), chunks, static_cast<double>(batch_of(input_log_probs)),
      ptr<float>(loss));
  HPM_CUDA_LAUNCH_CHECK("kl_div_total_kernel");
  return loss;
}

void kl_div_backward(const Tensor& grad, const Tensor& input_log_probs, const Tensor& target_probs,
                     Tensor* grad_input, Tensor* grad_target) {
  expect_grad(grad, "kl_div_backward");
  require_dtype(target_probs, DType::F32);
  if (grad_target != nullptr) {
    // The CPU reads the input as the target's shape; here a mismatch is an error.
    check_shape(input_log_probs, target_probs.shape(), "kl_div backward: input");
    require_dtype(input_log_probs, DType::F32);
  }
  float* pgi = nullptr;
  float* pgt = nullptr;
  if (grad_input != nullptr) {
    *grad_input = Tensor::empty(target_probs.shape(), DType::F32, target_probs.device());
    pgi = ptr<float>(*grad_input);
  }
  if (grad_target != nullptr) {
    *grad_target = Tensor::empty(target_probs.shape(), DType::F32, target_probs.device());
    pgt = ptr<float>(*grad_target);
  }
  const std::int64_t total = target_probs.numel();
  if (total == 0 || (pgi == nullptr && pgt == nullptr)) return;
  kl_div_backward_kernel<<<blocks_for(total, kBlock), kBlock, 0, current_stream()>>>(
      ptr<float>(grad), pgt != nullptr ? ptr<float>(input_log_probs) : nullptr,
      ptr<float>(target_probs), pgi, pgt, total, batch_of(input_log_probs));
  HPM_CUDA_LAUNCH_CHECK("kl_div_backward_kernel");
}

}  // namespace hpm::cuda
