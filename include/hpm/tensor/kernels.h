// The ops every layer above the tensor layer is built from, for tensors on any device: each
// dispatches to the backend of its inputs' device (backend.h) and allocates its outputs there.
// The dtype comes from the tensors (matmul of BF16 operands is a bf16 product with f32
// accumulation); reductions return 0-d tensors, so that only Tensor::item() waits for a device.
//
// Legend for shape comments: N = batch, C = channels, H/W = height/width, K = reduction size,
// OC = output channels, P = OH*OW output pixels, D = the reduced dimension.
#pragma once
#include <cstdint>
#include <vector>

#include "hpm/tensor/op_params.h"
#include "hpm/tensor/tensor.h"

namespace hpm {
class Generator;
}

namespace hpm::kernels {

// ---- conversions and memory --------------------------------------------------------------
// F32 -> BF16 rounding to nearest even (NaN stays NaN), and back (exact). Identity on a tensor
// already of the target dtype.
Tensor to_bf16(const Tensor& x);
// to_bf16 of each tensor, all on one device: in one launch on a GPU (autocast's weight copies).
std::vector<Tensor> to_bf16_many(const std::vector<Tensor>& xs);
// To f32 from BF16, F16 or F64 (exact from the 16-bit types; F64 rounds to nearest); F32 as is.
Tensor to_f32(const Tensor& x);
// To IEEE half from any floating type: round to nearest even, overflow to infinity.
Tensor to_f16(const Tensor& x);
// Every element of x set to `value` (converted to x's dtype).
void fill_(Tensor& x, float value);
// Whether the current device runs bf16 products natively (autocast to bf16 requires it).
bool native_bf16();

// ---- products ------------------------------------------------------------------------------
// 2-D matrix product of op(a) and op(b), op(X) = X or X^T: F32 operands, or BF16 ones with f32
// accumulation and an F32 result, or (out BF16, BF16 operands) the f32 result rounded to bf16 as
// the product writes it, without an F32 tensor: to_bf16 of the F32 product's values, but for the
// order in which a kernel writing bf16 may sum an element's terms (a bf16 step apart, rarely).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              DType out = DType::F32);
// c (F32, M x N) += op(a) op(b), accumulated by the product itself (a weight's gradient).
void matmul_add_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a = false,
                 bool trans_b = false);
// Batched product of op(a)(..., M, K) and op(b)(..., K, N) -> (..., M, N), the batch dimensions
// broadcast NumPy-style (a 2-D operand is shared by every batch).
Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// y(N,OUT) = x(N,IN) w(OUT,IN)^T + bias(OUT); bias (F32) may be undefined; x and w both F32 or
// both BF16 (then y is F32, or with out BF16 the F32 values, bias added, rounded to bf16 as the
// product writes them). With `residual` (F32, N x OUT; out F32), y = residual + x w^T + bias: a
// residual connection's add made by the product (on a GPU, cuBLASLt's C operand: no pass of its
// own).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType out = DType::F32,
              const Tensor& residual = Tensor());
// A Linear's parameter gradients from its output's gradient g(N,OUT) and input x(N,IN), both F32
// or both BF16: dw (F32, OUT x IN) = g^T x, added to dw's contents when `accumulate`; returns db
// (F32, OUT), g's rows summed (in f32, from g as given: a BF16 g's rounded values). One product
// on a GPU, the sum its epilogue.
Tensor linear_param_grads_(Tensor& dw, const Tensor& g, const Tensor& x, bool accumulate);

// ---- element-wise ------------------------------------------------------------------------------
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);  // NumPy broadcasting
Tensor add_scalar(const Tensor& a, float s);
Tensor mul_scalar(const Tensor& a, float s);
void axpy_(Tensor& y, float alpha, const Tensor& x);  // y += alpha * x (same numel)
void scale_(Tensor& y, float alpha);                  // y *= alpha
// y *= s, s a one-element F32 tensor on y's device, y F32 or BF16 (rounded back to it). Where s is
// exactly 1 nothing is written, and a device decides that itself: no host wait for s (a loss's
// gradient, 1 as a rule, scaling a gradient that assumed it).
void scale_by_(Tensor& y, const Tensor& s);
Tensor unary(UnaryOp op, const Tensor& x);
// dL/dx for a unary op given dL/dy, the input x and the output y; x may be BF16 (a copy autocast
// kept), read widened.
Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y);
// to_bf16(unary(op, x)) in one pass over x (F32): a bf16 product's operand made by its activation;
// with x_bf16, to_bf16(x) into it from the same pass (what bf16 autocast keeps of the input).
// x may be BF16 (a product's bf16 output): the same of to_f32(x), and *x_bf16 is x itself.
Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16 = nullptr);
// to_bf16(unary_backward(...)) in one pass: the gradient a bf16 product's rule takes as it is.
// grad_y may be BF16 where x is (a bf16 product's input gradient, its activation's bf16 input).
Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y);

// ---- reductions ----------------------------------------------------------------------------
// The sum of every element: a 0-d F32 tensor.
Tensor sum_all(const Tensor& x);
// The sum of the squares, accumulated in double: a 0-d F64 tensor.
Tensor sum_squares(const Tensor& x);
// The same over several tensors (a global gradient norm's square, for clipping): one 0-d F64
// tensor, left on the device (adam_step_multi_ reads it there).
Tensor squared_norm(const std::vector<Tensor>& xs);
Tensor sum_dim(const Tensor& x, int dim, bool keepdim);
// Reduces a broadcast result back to `shape` (the backward of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);
// Expands x to `shape` (x broadcastable to it).
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// Index of the largest value along the last dimension: (..., D) -> (...) as I64; x F32 or BF16
// (bf16 logits of a language model under autocast).
Tensor argmax_last(const Tensor& x);
// Top-1 accuracy's counts, left on the device: an I64 (2) tensor of [matches, counted] over I64
// `predicted` and `labels` of equal size, counting the labels that are not `ignore_index` and,
// among them, those equal to their prediction.
Tensor count_matches(const Tensor& predicted, const Tensor& labels, std::int64_t ignore_index);

// ---- softmax and losses ----------------------------------------------------------------------
Tensor softmax(const Tensor& x, int dim);
Tensor log_softmax(const Tensor& x, int dim);
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim);
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim);
// Mean cross-entropy (a 0-d tensor) of logits(..., C) against labels(...) with label smoothing
// eps, over the rows whose label is not ignore_index. Logits F32, or BF16 (here and in both
// backwards: read widened, the result that of their f32 widening). Writes `stats`, F32 (rows, 2):
// each row's max and 1 / sum(exp(x - max)), from which the backward recomputes softmax(logits) bit
// for bit rather than keep a (rows, C) tensor of probabilities (GPT-2's classifier on 16 x 1024
// tokens: 3.3 GB). A label outside [0, C) is a std::out_of_range naming it: at the op on the CPU,
// at the next copy from the device on a GPU (which does not wait for the check at the op).
// With `predicted`, it also receives argmax_last(logits) (I64, the labels' shape), found in the
// same pass over the logits: a classifier's accuracy then costs no read of them of its own (a
// GPT-2's logits: 1.6 GB in bf16).
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                             Tensor& stats, std::int64_t ignore_index = -100,
                             Tensor* predicted = nullptr);
// d loss / d logits (softmax - smoothed one-hot over the counted rows), scaled by grad (the
// upstream 0-d gradient); zero on ignored rows. `stats` is the forward's. With overwrite_logits
// the gradient is written over the logits, which the caller must no longer need, and returned as
// a tensor of their storage: the classifier's backward then allocates nothing of (rows, C).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                              float label_smoothing, const Tensor& grad,
                              std::int64_t ignore_index = -100, bool overwrite_logits = false);
// The same rounded to bf16 in the pass that computes it: the gradient a bf16 classifier's product
// takes as it is (half the bytes of an f32 one, and no rounding pass of its own). With
// overwrite_logits and BF16 logits it is written over them, as above.
Tensor cross_entropy_backward_bf16(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                   float label_smoothing, const Tensor& grad,
                                   std::int64_t ignore_index = -100, bool overwrite_logits = false);
// cross_entropy_forward and cross_entropy_backward (or its bf16 form, for BF16 logits) for an
// upstream gradient of 1 in one pass over the logits, which receive the gradient: returns the loss
// (0-d) and overwrites `logits` with d loss / d logits in their dtype, the values those two give
// (stats are not kept). For a training step whose logits nothing reads after its loss: one pass
// over GPT-2's (16 x 1024, 50304) logits where the forward and backward made two (on a GPU, each
// row's second read is meant to come from L2: not yet measured).
// A later upstream gradient g other than 1 is scale_by_(logits, g).
Tensor cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                    std::int64_t ignore_index = -100, Tensor* predicted = nullptr);
// Its gradients, scaled by grad (0-d); fills whichever pointer is non-null.
void kl_div_backward(const Tensor& grad, const Tensor& input_log_probs, const Tensor& target_probs,
                     Tensor* grad_input, Tensor* grad_target);
// KL(target || input) summed and divided by the batch (the first dimension), as PyTorch's
// kl_div(reduction='batchmean'); terms with target 0 count 0. A 0-d tensor.
Tensor kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs);
// d loss / d log_probs (of `shape`, (N,C)): -grad / N at each row's label, zero elsewhere.
Tensor nll_loss_backward(const Tensor& grad, const Tensor& labels, const Shape& shape);
// Mean negative log-likelihood (a 0-d tensor) of log_probs(N,C) at labels(N); throws
// std::out_of_range naming a label outside [0, C).
Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& labels);

// ---- attention -------------------------------------------------------------------------------
// Fused scaled dot-product attention, softmax(scale q k^T [causal mask]) v, tiled so that the
// score matrix is never materialized. q(..., T, D), k and v (..., S, D) -> (..., T, D) F32;
// `lse` receives each query row's log-sum-exp (..., T) for the backward. BF16 q, k, v: the
// products in bf16 with f32 accumulation (grad_out rounded for them), the softmax, out, lse and
// the gradients in f32.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& lse);
// Recomputes the probabilities tile by tile from q, k and lse; fills whichever pointer is non-null.
// out may be BF16 (the copy autocast keeps), read widened.
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, float scale,
                        Tensor* grad_q, Tensor* grad_k, Tensor* grad_v);
// Attention over the heads of a packed BF16 qkv (B, T, 3E) (q, k and v side by side, head h at
// columns [h D, (h + 1) D) of each, E = heads x D): the output merged (B, T, E) and rounded to
// BF16, lse (B, heads, T). The values of split_qkv_heads(qkv, heads, BF16), attention_forward and
// merge_heads_bf16; a backend with a kernel for it (CUDA's, head sizes 32, 64, 128) reads and
// writes those layouts in place, with no copy between them.
Tensor packed_attention_forward_bf16(const Tensor& qkv, std::int64_t heads, bool causal,
                                     float scale, Tensor& lse);
// Its gradient with respect to qkv, (B, T, 3E) in grad_dtype (F32, or BF16 rounded once), from
// grad_out (B, T, E), F32 or BF16 (a bf16 product's input gradient, read widened), the forward's
// output and lse: attention_backward's on the split heads (grad_out and out widened), merged as
// merge_qkv_heads (or merge_qkv_heads_bf16) would.
Tensor packed_attention_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, std::int64_t heads, bool causal, float scale,
                                 DType grad_dtype);

// ---- layout -----------------------------------------------------------------------------
Tensor transpose2d(const Tensor& x);  // (R,C) -> (C,R)
Tensor permute(const Tensor& x, const std::vector<int>& perm);
// Inputs joined along `dim` (equal extents elsewhere, one dtype).
Tensor concat(const std::vector<Tensor>& xs, int dim);
// A copy of x's [start, start + length) along `dim`; narrow_add_ adds `part` into that slice of y.
Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length);
void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part);
// Attention heads, one pass each: a packed (B, T, 3 x H x D) q|k|v, as one Linear computes it, to
// q, k and v (B, H, T, D) of `dtype` (F32, or BF16 rounded on the way; a BF16 qkv, a product's
// bf16 output, to BF16 heads only), and their F32 gradients back; (B, T, H x D) <-> (B, H, T, D)
// for one tensor.
void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                     Tensor& v);
Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v);
// to_bf16(merge_qkv_heads(q, k, v)) in one pass: attention's gradient for a bf16 qkv product.
Tensor merge_qkv_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v);
Tensor split_heads(const Tensor& x, std::int64_t heads);
Tensor merge_heads(const Tensor& y);
// to_bf16(merge_heads(y)) in one pass over y: a bf16 product's operand made by the attention; with
// y_bf16, to_bf16(y) into it from the same pass (what bf16 autocast keeps of the output).
Tensor merge_heads_bf16(const Tensor& y, Tensor* y_bf16 = nullptr);
// Masks are I8 (nonzero = true), broadcast NumPy-style. where: cond ? a : b (all broadcast).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` where mask (broadcast to x's shape) is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);
// Rows of x(N,...) picked by indices, in order: the batcher's gather.
Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices);

// ---- convolution and pooling ------------------------------------------------------------------
// x(N,C,H,W), w(OC,C,KH,KW), bias(OC) or undefined -> (N,OC,OH,OW)
Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
// Fills whichever of grad_x, grad_w, grad_bias is non-null.
void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                     Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias);
// x(N,C,H,W) -> (N,C,OH,OW); `argmax` receives the flat input index (within H*W) of each max (I32).
Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const Shape& x_shape);
// max_pool2d(relu(conv2d(x))) (p.relu implied) and its gradients from the pooled gradient, in one
// op: the same values and gradients as the three apart (a backend may keep the convolution's
// output in its own layout between them).
Tensor conv2d_relu_max_pool2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Conv2dParams& p, const Pool2dParams& pool,
                                      Tensor& argmax);
void conv2d_relu_max_pool2d_backward(const Tensor& grad_pooled, const Tensor& argmax,
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
void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, bool training,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias);
// Running statistics (F32, C) moved by `momentum` towards the mean and the unbiased variance of
// `count` values whose sums channel_moments_ gathered.
void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                           const Tensor& sum_squares, std::int64_t count, float momentum);
// Adds to sum and sum_squares (F64, C) the sums of x(N,C,...) and of its squares per channel,
// in double (a BatchNorm's running statistics over several micro-batches).
void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x);
// Normalizes over the trailing `normalized` elements of each row.
Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                          const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd);
// to_bf16(layer_norm_forward(...)) in one pass over x: a bf16 product's operand made by its
// layer norm; with x_bf16, to_bf16(x) into it from the same pass (what bf16 autocast keeps of x).
Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                               const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd,
                               Tensor* x_bf16 = nullptr);
// A residual stream's sum and its layer norm in one pass: sum = a + b (F32, same shape), and
// layer_norm_forward_bf16 of it (with sum_bf16, to_bf16(sum) into it), bit for bit; the sum is
// read by no second pass.
Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                   const Tensor& weight, const Tensor& bias, float eps, Tensor& sum,
                                   Tensor& save_mean, Tensor& save_rstd,
                                   Tensor* sum_bf16 = nullptr);
// x F32 or BF16 (a copy autocast kept, read widened); grad_y F32 or BF16 (a bf16 product's input
// gradient, read widened). When *grad_x is defined on entry (F32, x's shape, x's device: the
// gradient summed so far for x, as autograd::take_pending_gradient hands it), dx is added into
// it, as the sum *grad_x + dx would be, without a pass of its own; otherwise *grad_x is a new
// tensor. With grad_x_bf16 (and grad_x), *grad_x_bf16 becomes to_bf16(*grad_x) as it ends, written
// by the same pass: the copy a bf16 product's rule takes next (a residual stream's gradient, in
// GPT's blocks), which then reads no f32 gradient to round it.
void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                         Tensor* grad_x_bf16 = nullptr);

// ---- embedding -----------------------------------------------------------------------------
// table(V,E), indices(...) I64 -> (..., E). Throws std::out_of_range naming a bad index: at the op
// on the CPU, at the next copy from the device on a GPU (zero rows for it meanwhile).
Tensor embedding_forward(const Tensor& table, const Tensor& indices);
void embedding_backward(const Tensor& grad_y, const Tensor& indices, Tensor& grad_table);

// ---- optimizer updates -------------------------------------------------------------------
// One Adam(W) step (AdamStep says which) on p, in place, with its state m and v; vmax is
// AMSGrad's running maximum, or undefined. All F32 of p's size.
void adam_step_(const AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor& vmax);
// adam_step_ on many parameters at once (the same AdamStep for each; one kernel launch for dozens
// on a GPU): params[i] with grads[i], exp_avg[i], exp_avg_sq[i] and max_exp_avg_sq[i] (that list
// empty without AMSGrad). With `grad_norm_sq` defined (an F64 scalar beside them: squared_norm of
// all the step's gradients) the gradients are clipped first as clip_grad_norm does, read on the
// device: coef = max_norm / (sqrt(grad_norm_sq) + 1e-6) and, when coef < 1, each gradient is scaled
// by coef in place before its update (a non-finite norm scales nothing, as there).
// With `halted` defined (an I32 scalar beside them, 0 while updates run) the update is gated on the
// device, so that the host need not wait for the norm: while halted holds 0 and the norm (if
// given) is finite, everything above happens; otherwise nothing changes (no parameter, moment or
// gradient) and halted becomes 1, which skips every later gated update too until the host, which
// reads it when it next waits anyway, clears it.
void adam_step_multi_(const AdamStep& s, const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                      const std::vector<Tensor>& exp_avg_sq,
                      const std::vector<Tensor>& max_exp_avg_sq, const Tensor& grad_norm_sq,
                      float max_norm, const Tensor& halted = Tensor());
// The gate of a step's update whose verdict the host reads later: `halted` (the I32 scalar given
// to adam_step_multi_) becomes 1 unless `value` (an F32 scalar: the step's loss) is finite and,
// on a device that defers its index checks (a GPU's embedding indices and labels), every check
// the calling thread issued on it so far passed. A flag already 1 stays 1.
void halt_unless_finite_(Tensor& halted, const Tensor& value);
// One SGD step (SgdStep says which) on p, in place; buf is the momentum buffer, or undefined
// without momentum.
void sgd_step_(const SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf);

// ---- random ----------------------------------------------------------------------------
// Inverted dropout mask on the current device: 0 with probability p, else 1/(1-p).
Tensor dropout_mask(const Shape& shape, float p, Generator& gen);

}  // namespace hpm::kernels
