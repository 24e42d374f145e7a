// The CPU backend's kernels (src/tensor/backend/cpu/): oneDNN and our own vectorized loops. No
// autograd here; each forward kernel sits beside its backward (llm.c style). Code above the tensor
// layer calls the device-independent ops of hpm/tensor/kernels.h, which dispatch here for CPU
// tensors (cpu_backend.cpp); this header is for the backend itself, its tests and benchmarks, and
// the explicit host views that handle raw bytes (a collective reducing bf16 messages).
//
// Legend for shape comments: N = batch, C = channels, H/W = height/width, K = reduction size,
// OC = output channels, P = OH*OW output pixels, D = the reduced dimension.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpm/tensor/op_params.h"
#include "hpm/tensor/tensor.h"

namespace hpm {
class Generator;
}

namespace hpm::cpu {

using kernels::AdamStep;
using kernels::BinaryOp;
using kernels::Conv2dParams;
using kernels::Pool2dParams;
using kernels::SgdStep;
using kernels::UnaryOp;

// ---- GEMM (oneDNN) -----------------------------------------------------------------------------
// C(M,N) = alpha * op(A) op(B) + beta * C, row-major; op(X) = X or X^T.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);
// Whether gemm first copies B to padded rows: short products whose B rows lie a multiple of 2 KiB
// apart, which oneDNN's in-place ("no-copy") kernels read at half speed (gemm.cpp says why).
bool gemm_pads_b(bool trans_b, std::int64_t m, std::int64_t n, std::int64_t ldb);
// ---- bfloat16 (bf16.cpp) ---------------------------------------------------------------------
// Whether this CPU has AVX512_BF16 (native bf16 dot products; elsewhere oneDNN emulates them at a
// fraction of the f32 speed).
bool native_bf16();
// F32 -> BF16 rounding to nearest even (NaN stays NaN), and back (exact). Identity on a tensor
// already of the target dtype.
Tensor to_bf16(const Tensor& x);
// The same on raw spans, one thread (callers that convert inside another loop: a collective's
// reduction of bf16 messages).
void f32_to_bf16(const float* x, std::uint16_t* y, std::int64_t n);
void bf16_to_f32(const std::uint16_t* x, float* y, std::int64_t n);
// To f32 from BF16, F16 or F64 (exact from the 16-bit types; F64 rounds to nearest); F32 as is.
Tensor to_f32(const Tensor& x);
// To IEEE half from any floating type: round to nearest even, overflow to infinity.
Tensor to_f16(const Tensor& x);
// C(M,N) = alpha * op(A) op(B) + beta * C with bf16 A and B (as bits), f32 C and accumulation.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
               std::int64_t ldb, float beta, float* c, std::int64_t ldc);
// 2-D BF16 operands, F32 result (or BF16, out_bf16: the f32 result rounded to nearest even as
// oneDNN writes it, with no f32 result in memory); linear_bf16's bias is F32 (may be undefined).
Tensor matmul_bf16(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
                   bool out_bf16 = false);
Tensor linear_bf16(const Tensor& x, const Tensor& w, const Tensor& bias);
// oneDNN's name for the implementation gemm_bf16 runs for an (m, k) x (k, n) product, e.g.
// "brg:avx512_core_bf16" (native) or one naming an emulation.
std::string gemm_bf16_implementation(std::int64_t m, std::int64_t n, std::int64_t k);

// 2-D matrix product of op(a) and op(b).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// Batched product of op(a)(..., M, K) and op(b)(..., K, N) -> (..., M, N), the batch dimensions
// broadcast NumPy-style (a 2-D operand is shared by every batch).
Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// y(N,OUT) = x(N,IN) w(OUT,IN)^T + bias(OUT); bias may be undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);

// ---- element-wise ------------------------------------------------------------------------------
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);  // NumPy broadcasting
Tensor add_scalar(const Tensor& a, float s);
Tensor mul_scalar(const Tensor& a, float s);
void axpy_(Tensor& y, float alpha, const Tensor& x);  // y += alpha * x (same numel)
void scale_(Tensor& y, float alpha);                  // y *= alpha
void scale_by_(Tensor& y, float s);  // y *= s, F32 or BF16 y; nothing done where s is 1

Tensor unary(UnaryOp op, const Tensor& x);
// to_bf16(unary(op, x)) (and *x_bf16 = to_bf16(x)) in one pass: block by block, no f32 output;
// x F32, or BF16 (widened as read; *x_bf16 is then x itself).
Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16);
// dL/dx for a unary op given dL/dy, the input x and the output y (any of them a BF16 copy,
// widened block by block).
Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y);
// to_bf16(unary_backward(...)) in one pass.
Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y);

// ---- reductions ----------------------------------------------------------------------------
float sum_all(const Tensor& x);
double sum_squares(const Tensor& x);
Tensor sum_dim(const Tensor& x, int dim, bool keepdim);
// Reduces a broadcast result back to `shape` (the backward of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);
// Expands x to `shape` (x broadcastable to it).
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// Index of the largest value along the last dimension: (..., D) -> (...) as I64; x F32 or BF16.
Tensor argmax_last(const Tensor& x);

// ---- softmax and losses ----------------------------------------------------------------------
Tensor softmax(const Tensor& x, int dim);
Tensor log_softmax(const Tensor& x, int dim);
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim);
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim);
// Mean cross-entropy of logits(..., C) against labels(...) with label smoothing eps, over the
// rows whose label is not ignore_index; writes each row's max and 1 / sum(exp(x - max)) to
// `stats` (rows, 2) for the backward, and with `predicted` each row's argmax_last (kernels.h).
float cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                            Tensor& stats, std::int64_t ignore_index = -100,
                            Tensor* predicted = nullptr);
// The forward, and over the logits (F32 or BF16) their gradient for an upstream 1 (kernels.h).
float cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                   std::int64_t ignore_index = -100, Tensor* predicted = nullptr);
// Mean of -log_probs(N,C) at labels(N); its gradient, -grad / N at the labels.
float nll_loss_forward(const Tensor& log_probs, const Tensor& labels);
Tensor nll_loss_backward(float grad, const Tensor& labels, const Shape& shape);
// sum t (log t - x) / batch over t > 0, and its gradients scaled by grad.
float kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs);
void kl_div_backward(float grad, const Tensor& input_log_probs, const Tensor& target_probs,
                     Tensor* grad_input, Tensor* grad_target);
// d loss / d logits, scaled by grad (the upstream scalar); zero on ignored rows. Logits F32 or
// BF16 (here and in the forward); the gradient F32 or BF16 (`out`: computed in f32, rounded as
// stored), written over the logits when overwrite_logits and they are of its dtype.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                              float label_smoothing, float grad, std::int64_t ignore_index = -100,
                              bool overwrite_logits = false, DType out = DType::F32);

// ---- attention -------------------------------------------------------------------------------
// Fused scaled dot-product attention, softmax(scale q k^T [causal mask]) v, tiled so that the
// score matrix is never materialized (attention.cpp). q(..., T, D), k and v (..., S, D) ->
// (..., T, D); `lse` receives each query row's log-sum-exp (..., T) for the backward.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& lse);
// Recomputes the probabilities tile by tile from q, k and lse; fills whichever pointer is non-null.
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, float scale,
                        Tensor* grad_q, Tensor* grad_k, Tensor* grad_v);
// The same with BF16 q, k, v (attention_bf16.cpp): the products in bf16 with f32 accumulation
// (grad_out rounded for them), the softmax, out, lse and the gradients in f32. Blocks of 64 query
// rows against every key they see, batched across heads; the scores of a chunk of heads exist at
// once (at most 512 KiB).
Tensor attention_forward_bf16(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                              float scale, Tensor& lse);
void attention_backward_bf16(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse, bool causal,
                             float scale, Tensor* grad_q, Tensor* grad_k, Tensor* grad_v);

// ---- layout -----------------------------------------------------------------------------
Tensor transpose2d(const Tensor& x);  // (R,C) -> (C,R)
Tensor permute(const Tensor& x, const std::vector<int>& perm);
// Inputs joined along `dim` (equal extents elsewhere, one dtype).
Tensor concat(const std::vector<Tensor>& xs, int dim);
// A copy of x's [start, start + length) along `dim`; narrow_add_ adds `part` into that slice of y.
Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length);
void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part);
// Attention heads (heads_layout.cpp), one pass each: a packed (B, T, 3 x H x D) q|k|v, as one
// Linear computes it, to q, k and v (B, H, T, D) of `dtype` (F32, or BF16 rounded on the way),
// and their F32 gradients back; (B, T, H x D) <-> (B, H, T, D) for one tensor.
void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                     Tensor& v);
Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v);
Tensor split_heads(const Tensor& x, std::int64_t heads);
Tensor merge_heads(const Tensor& y);
// Masks are I8 (nonzero = true), broadcast NumPy-style. where: cond ? a : b (all broadcast).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` where mask (broadcast to x's shape) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);
// Rows of x(N,...) picked by indices (I64), in order: the batcher's gather.
Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices);

// ---- convolution ------------------------------------------------------------------------------
// x(N,C,H,W), w(OC,C,KH,KW), bias(OC) or undefined -> (N,OC,OH,OW)
// Runs oneDNN's convolution primitives, falling back to im2col + GEMM for shapes oneDNN rejects;
// the environment variable HPM_CONV=im2col (read once) forces the im2col path.
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
// Fills whichever of grad_x, grad_w, grad_bias is non-null.
void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                     Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias);
// The two implementations, for tests and benchmarks. The oneDNN ones throw dnnl::error for a
// shape no oneDNN implementation accepts.
Tensor conv2d_forward_im2col(const Tensor& x, const Tensor& w, const Tensor& bias,
                             const Conv2dParams& p);
void conv2d_backward_im2col(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                            const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                            Tensor* grad_bias);
Tensor conv2d_forward_dnnl(const Tensor& x, const Tensor& w, const Tensor& bias,
                           const Conv2dParams& p);
void conv2d_backward_dnnl(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                          const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias);

// ---- pooling ---------------------------------------------------------------------------
// x(N,C,H,W) -> (N,C,OH,OW); `argmax` receives the flat input index (within H*W) of each max (I32).
Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const Shape& x_shape);

// max_pool2d(relu(conv2d(x))) (p.relu implied) and its gradients from the pooled gradient, in one
// op: the same values and gradients as the three apart. With oneDNN, when its convolutions take a
// channel-blocked layout, the convolution's output stays in it: pooled from it forward, and the
// unpooled gradient written into it backward (in bf16 for a bf16 convolution), with no reorders.
Tensor conv2d_relu_max_pool2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Conv2dParams& p, const Pool2dParams& pool,
                                      Tensor& argmax);
void conv2d_relu_max_pool2d_backward(const Tensor& grad_pooled, const Tensor& argmax,
                                     const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                     const Pool2dParams& pool, Tensor* grad_x, Tensor* grad_w,
                                     Tensor* grad_bias);
Tensor conv2d_relu_max_pool2d_forward_dnnl(const Tensor& x, const Tensor& w, const Tensor& bias,
                                           const Conv2dParams& p, const Pool2dParams& pool,
                                           Tensor& argmax);
void conv2d_relu_max_pool2d_backward_dnnl(const Tensor& grad_pooled, const Tensor& argmax,
                                          const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                          const Pool2dParams& pool, Tensor* grad_x, Tensor* grad_w,
                                          Tensor* grad_bias);
Tensor avg_pool2d_forward(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p);

// ---- normalization ---------------------------------------------------------------------------
// x(N,C,S) with S = spatial size (1 for BatchNorm1d). Training mode normalizes by the batch
// statistics, saves mean and inverse std (C) and updates running stats with `momentum`
// (unbiased variance, as PyTorch); evaluation mode uses the running stats.
Tensor batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          Tensor& running_mean, Tensor& running_var, bool training, float momentum,
                          float eps, Tensor& save_mean, Tensor& save_invstd);
// Per-channel sums and sums of squares of x(N,C,...) added to F64 accumulators, and the running
// statistics' update from them (kernels.h).
void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x);
void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                           const Tensor& sum_squares, std::int64_t count, float momentum);
void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, bool training,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias);
// Normalizes over the trailing `normalized` elements of each row.
Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                          const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd);
// to_bf16(layer_norm_forward(...)) (and *x_bf16 = to_bf16(x)) in one pass over x: rows by
// rows, no f32 output.
Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                               const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd,
                               Tensor* x_bf16);
// sum = a + b and layer_norm_forward_bf16(sum, ...) in one pass over the rows.
Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                   const Tensor& weight, const Tensor& bias, float eps, Tensor& sum,
                                   Tensor& save_mean, Tensor& save_rstd, Tensor* sum_bf16);
// With grad_x_bf16 (and grad_x), dx rounded to bf16 too, span by span while it is in cache.
void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                         Tensor* grad_x_bf16 = nullptr);

// ---- embedding -----------------------------------------------------------------------------
// table(V,E), indices(...) I64 -> (..., E). Throws std::out_of_range naming a bad index.
Tensor embedding_forward(const Tensor& table, const Tensor& indices);
void embedding_backward(const Tensor& grad_y, const Tensor& indices, Tensor& grad_table);

// ---- optimizer updates -------------------------------------------------------------------
// One Adam(W) step over n elements, in place: p *= decay (AdamW's decoupled decay, else 1);
// d = g + l2 * p; m = beta1 m + (1 - beta1) d; v = beta2 v + (1 - beta2) d^2; vmax = max(vmax, v)
// when vmax is given (AMSGrad); p -= step_size * m / (sqrt(v or vmax) / bias2_sqrt + eps).
// buf is null without momentum.
void sgd_step(const SgdStep& s, float* p, const float* g, float* buf, std::int64_t n);
void adam_step(const AdamStep& s, float* p, const float* g, float* m, float* v, float* vmax,
               std::int64_t n);

// ---- random ----------------------------------------------------------------------------
// Inverted dropout mask: 0 with probability p, else 1/(1-p).
Tensor dropout_mask(const Shape& shape, float p, Generator& gen);

}  // namespace hpm::cpu
