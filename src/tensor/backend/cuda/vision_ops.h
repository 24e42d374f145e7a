// The CUDA backend's pooling (pool.cu), batch norm (batch_norm.cu) and distillation losses
// (distill_losses.cu). Each has the parameter list of its Backend virtual (backend.h; kernels.h
// documents what it computes) and matches the CPU backend's results, dtypes and host-side errors.
// Every kernel runs on the current device's compute stream; results are deterministic run to run
// (fixed reduction orders, gathers instead of scatters, no float atomics).
#pragma once
#include <cstdint>

#include "hpm/tensor/op_params.h"
#include "hpm/tensor/tensor.h"

namespace hpm::cuda {

// ---- pooling (pool.cu) ------------------------------------------------------------------------
// max: NaN wins and, among equals, the first in row-major order (pool.cpp's general path); the
// argmax is the flat index within the H*W plane (I32). The backwards are gathers: each input pixel
// adds the gradients of the windows it feeds in increasing output order, the CPU's scatter order.
Tensor max_pool2d_forward(const Tensor& x, const kernels::Pool2dParams& p, Tensor& argmax);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const Shape& x_shape);
Tensor avg_pool2d_forward(const Tensor& x, const kernels::Pool2dParams& p);
Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape,
                           const kernels::Pool2dParams& p);

// ---- batch norm (batch_norm.cu) ---------------------------------------------------------------
// Per-channel statistics in double, one block per channel with a fixed-order reduction.
Tensor batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          Tensor& running_mean, Tensor& running_var, bool training, float momentum,
                          float eps, Tensor& save_mean, Tensor& save_invstd);
void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, bool training,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias);
void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x);
void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                           const Tensor& sum_squares, std::int64_t count, float momentum);

// ---- distillation losses (distill_losses.cu) --------------------------------------------------
// The forwards return 0-d F32 tensors on the device. nll_loss_forward checks the labels on the
// device; a bad one is the CPU's std::out_of_range, thrown at the host's next copy from the device
// (deferred_checks.h). The backwards' `grad` is the 0-d upstream gradient
// on the device, read by the kernels (no host wait).
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& labels);
Tensor nll_loss_backward(const Tensor& grad, const Tensor& labels, const Shape& shape);
Tensor kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs);
void kl_div_backward(const Tensor& grad, const Tensor& input_log_probs, const Tensor& target_probs,
                     Tensor* grad_input, Tensor* grad_target);

}  // namespace hpm::cuda
