// Products on cuBLAS: matmul, matmul_add_, bmm, linear and linear_param_grads_ (the last two on
// cuBLASLt with the bias or its gradient fused where it offers an algorithm, lt_matmul.h), with
// the CPU's shapes, dtypes and errors. F32 operands multiply in full f32 unless
// HPM_CUDA_ALLOW_TF32=1 (PyTorch's torch.backends.cuda.matmul.allow_tf32); BF16 ones on the tensor
// cores with f32 accumulation and an F32 result, or for matmul and linear a BF16 one (the f32
// result rounded as it is written).
#pragma once
#include "hpm/tensor/tensor.h"

namespace hpm::cuda {

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType out);
void matmul_add_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType out,
              const Tensor& residual = Tensor());
Tensor linear_param_grads_(Tensor& dw, const Tensor& g, const Tensor& x, bool accumulate);

}  // namespace hpm::cuda
