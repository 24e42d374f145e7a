// Differentiable operations: each computes with the tensor layer's kernels and records its
// gradient rule (src/autograd/ops.cpp keeps every rule next to its forward).
#pragma once
#include <cstdint>
#include <vector>

#include "hpm/tensor/kernels.h"
#include "hpm/tensor/tensor.h"

namespace hpm {

class Generator;

// ---- arithmetic (NumPy broadcasting) ---------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, float s);
Tensor mul(const Tensor& a, float s);
Tensor neg(const Tensor& a);
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, float s) { return add(a, s); }
inline Tensor operator*(const Tensor& a, float s) { return mul(a, s); }
inline Tensor operator*(float s, const Tensor& a) { return mul(a, s); }
inline Tensor operator-(const Tensor& a) { return neg(a); }

// ---- element-wise functions ----------------------------------------------------------------
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);

// ---- reductions -----------------------------------------------------------------------------
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);

// ---- shape ----------------------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int start_dim = 1);  // (N, ...) -> (N, prod(...))
Tensor transpose(const Tensor& x);                   // 2-D
Tensor permute(const Tensor& x, const std::vector<int>& perm);

// ---- linear algebra -------------------------------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);  // x W^T + b

// ---- convolution and pooling ----------------------------------------------------------------
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const kernels::Conv2dParams& p);
Tensor max_pool2d(const Tensor& x, const kernels::Pool2dParams& p);
Tensor avg_pool2d(const Tensor& x, const kernels::Pool2dParams& p);
Tensor global_avg_pool2d(const Tensor& x);  // (N,C,H,W) -> (N,C)

// ---- normalization, embedding, dropout ------------------------------------------------------
// running_mean/var are updated in place in training mode (may be undefined).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, float momentum, float eps);
Tensor layer_norm(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                  const Tensor& bias, float eps);
Tensor embedding(const Tensor& table, const Tensor& indices);
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen);

// ---- softmax and losses (mean reduction) ----------------------------------------------------
Tensor softmax(const Tensor& x, int dim = -1);
Tensor log_softmax(const Tensor& x, int dim = -1);
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, float label_smoothing = 0.0f);
Tensor nll_loss(const Tensor& log_probs, const Tensor& labels);
Tensor mse_loss(const Tensor& input, const Tensor& target);
// KL(target || exp(input)) summed over classes and divided by the batch size, as PyTorch's
// F.kl_div(input, target, reduction='batchmean'): input holds log-probabilities, target
// probabilities.
Tensor kl_div(const Tensor& input_log_probs, const Tensor& target_probs);

}  // namespace hpm
