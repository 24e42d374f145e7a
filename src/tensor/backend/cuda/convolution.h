// 2-D convolution on cuDNN, NCHW in f32, with the CPU's shapes, errors and semantics. The
// algorithms are cuDNN's fastest deterministic ones (its heuristics, not a timed search), so a
// run repeats bit for bit; f32 products stay f32 unless HPM_CUDA_ALLOW_TF32=1. Autocast's bf16
// request (Conv2dParams::bf16) is declined for now, as the CPU's im2col path declines it: the
// result is the same f32 tensor, computed in f32.
#pragma once
#include "hpm/tensor/op_params.h"
#include "hpm/tensor/tensor.h"

namespace hpm::cuda {

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const kernels::Conv2dParams& p);
void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                     const kernels::Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                     Tensor* grad_bias);

}  // namespace hpm::cuda
