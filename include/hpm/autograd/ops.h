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
Tensor flatten(const Tensor& x, int start_dim = 1);     // (N, ...) -> (N, prod(...))
Tensor transpose(const Tensor& x);                      // 2-D
Tensor transpose(const Tensor& x, int dim0, int dim1);  // swaps two dimensions (a copy)
Tensor permute(const Tensor& x, const std::vector<int>& perm);
// x's [start, start + length) along `dim` (a copy: tensors are contiguous).
Tensor narrow(const Tensor& x, int dim, std::int64_t start, std::int64_t length);
Tensor concat(const std::vector<Tensor>& xs, int dim);
// Pieces of `size` along `dim` (the last may be shorter), as torch.split with an int.
std::vector<Tensor> split(const Tensor& x, std::int64_t size, int dim);
// `chunks` pieces of ceil(extent / chunks) along `dim`, as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, int dim);

// ---- selection (masks are I8, nonzero = true, broadcast NumPy-style) ---------------------------
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);

// ---- linear algebra -------------------------------------------------------------------------
// 2-D, or batched (..., M, K) x (..., K, N) with the batch dimensions broadcast, as torch.matmul
// for operands of rank >= 2.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);  // x W^T + b
// linear(gelu(x), weight, bias) (exact GELU; x 2-D): the same values and gradients; under bf16
// autocast one pass over x makes the product's bf16 operand, where the composition makes three.
// With `residual` (F32, the output's shape), add(residual, linear(gelu(x), weight, bias)): a
// transformer MLP's residual connection, added by the product under bf16 autocast (no pass).
Tensor gelu_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                   const Tensor& residual = Tensor());
// linear(layer_norm(x over its last dimension, ln_weight, ln_bias, eps), weight, bias) (x 2-D):
// likewise, the norm writing the product's bf16 operand under bf16 autocast. There, out BF16 has
// the product write its output rounded to bf16 (for gelu_linear, which then keeps it as GELU's
// bf16 input: what PyTorch's autocast rounds); elsewhere the output is F32 whatever out says.
// x may also be BF16 in gelu_linear: a product's bf16 output, under the fusions only.
Tensor layer_norm_linear(const Tensor& x, const Tensor& ln_weight, const Tensor& ln_bias, float eps,
                         const Tensor& weight, const Tensor& bias, DType out = DType::F32);
// A residual stream's step: sum = add(a, b) (a and b 2-D, one shape) and
// layer_norm_linear(sum, ...), returned, with the same values and gradients; under bf16 autocast
// the sum and the norm in one pass (add_layer_norm_forward_bf16): the sum is not read again.
Tensor residual_layer_norm_linear(const Tensor& a, const Tensor& b, Tensor& sum,
                                  const Tensor& ln_weight, const Tensor& ln_bias, float eps,
                                  const Tensor& weight, const Tensor& bias, DType out = DType::F32);
// linear(packed_self_attention(qkv, heads, causal), weight, bias) over its rows: qkv (B, T, 3E)
// -> (B, T, OUT); likewise, the attention's merged heads written as the product's bf16 operand.
Tensor packed_self_attention_linear(const Tensor& qkv, std::int64_t heads, bool causal,
                                    const Tensor& weight, const Tensor& bias);

// ---- convolution and pooling ----------------------------------------------------------------
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const kernels::Conv2dParams& p);
Tensor max_pool2d(const Tensor& x, const kernels::Pool2dParams& p);
// max_pool2d(relu(conv2d(x))) as one op (p.relu is implied): the same values and gradients, no
// pass of its own for the ReLU's backward, and the convolution's full-size output not kept.
Tensor conv2d_relu_max_pool2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              const kernels::Conv2dParams& p, const kernels::Pool2dParams& pool);
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
// softmax over the entries where mask is false; a row masked everywhere gives zeros.
Tensor masked_softmax(const Tensor& x, const Tensor& mask, int dim = -1);
// Mean over the rows of logits (..., C) whose label (...) is not ignore_index: (N, C) for a
// classifier, (B, T, V) for a language model. With `predicted`, also each row's argmax (I64, the
// labels' shape; kernels::argmax_last's) from the same pass over the logits.
//
// logits_spent is the caller's word that nothing reads the logits after this op (a training
// step's objective passes outputs_spent()). Where the logits' gradient will then be wanted (grad
// mode on, logits requiring it, the gradient in their dtype) and no other tensor holds their
// memory, the forward writes that gradient over them for an upstream gradient of 1
// (kernels::cross_entropy_with_gradient_: one pass over GPT-2's 1.6 GB of logits, not two), and the
// backward scales it by the one it gets (no pass where that is 1). The values are those of the
// separate passes. HPM_FUSED_CROSS_ENTROPY=0 at start keeps the separate passes (an A/B).
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, float label_smoothing = 0.0f,
                     std::int64_t ignore_index = -100, Tensor* predicted = nullptr,
                     bool logits_spent = false);
// Whether this thread is inside an OutputsSpentScope(true): the caller of an objective drops the
// model's outputs once the objective has its loss (distribute::replica_step), so an objective
// whose cross_entropy reads them last may tell it so (its logits_spent).
bool outputs_spent();
class OutputsSpentScope {
 public:
  explicit OutputsSpentScope(bool spent);
  ~OutputsSpentScope();
  OutputsSpentScope(const OutputsSpentScope&) = delete;
  OutputsSpentScope& operator=(const OutputsSpentScope&) = delete;

 private:
  bool previous_;
};
Tensor nll_loss(const Tensor& log_probs, const Tensor& labels);
Tensor mse_loss(const Tensor& input, const Tensor& target);
// KL(target || exp(input)) summed over classes and divided by the batch size, as PyTorch's
// F.kl_div(input, target, reduction='batchmean'): input holds log-probabilities, target
// probabilities.
Tensor kl_div(const Tensor& input_log_probs, const Tensor& target_probs);

// ---- attention ------------------------------------------------------------------------------
// softmax(scale q k^T) v with q (..., T, D), k and v (..., S, D), e.g. (B, heads, T, head size);
// causal: query i attends to keys j <= i. scale <= 0 means 1 / sqrt(D). One fused, tiled op: the
// T x S scores are never stored; backward recomputes them a tile at a time (as FlashAttention).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = false, float scale = 0.0f);
// Multi-head self-attention from one Linear's packed q|k|v (B, T, 3E) with E = heads x D, to the
// heads merged back (B, T, E): scaled_dot_product_attention of its q, k and v split into heads,
// with the split and the merge each one pass forward and backward (and q, k, v rounded in that
// pass under bf16) instead of a permute, three copies and their gradients' sums.
Tensor packed_self_attention(const Tensor& qkv, std::int64_t heads, bool causal = true,
                             float scale = 0.0f);

}  // namespace hpm
