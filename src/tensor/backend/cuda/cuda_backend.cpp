// The CUDA backend: cuda:N devices (device_memory.h), products on cuBLAS (blas_ops.h),
// convolution on cuDNN (convolution.h), the kernels of this folder (basic_ops.h, nn_ops.h,
// vision_ops.h), and dropout's mask drawn by the host's generator (host_fallback.h).
#include <stdexcept>
#include <string>

#include "hpm/tensor/backend.h"
#include "hpm/tensor/random.h"
#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/blas_ops.h"
#include "tensor/backend/cuda/convolution.h"
#include "tensor/backend/cuda/device_memory.h"
#include "tensor/backend/cuda/host_fallback.h"
#include "tensor/backend/cuda/host_reads.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"
#include "tensor/backend/cuda/vision_ops.h"

namespace hpm {
namespace {

using cuda::HostFallback;

class CudaBackend final : public Backend {
 public:
  DeviceType type() const override { return DeviceType::kCuda; }
  bool is_host() const override { return false; }
  std::shared_ptr<MemoryResource> memory(int index) override {
    const int n = cuda::device_count();
    if (index < 0 || index >= n) {
      throw std::runtime_error("cuda:" + std::to_string(index) +
                               " was asked for, but this machine has " + std::to_string(n) +
                               " CUDA device(s) (cuda:0" +
                               (n > 1 ? " to cuda:" + std::to_string(n - 1) : std::string()) + ")");
    }
    cuda::context(index);  // streams and handles now, so that a broken driver shows here
    return std::make_shared<cuda::DeviceMemory>(index);
  }
  std::unique_ptr<Stream> make_stream(DeviceId id) override {
    return cuda::make_compute_stream(id);
  }
  void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                  std::size_t bytes) override {
    cuda::copy_bytes(dst, dst_device, src, src_device, bytes);
  }
  std::unique_ptr<PendingRead> begin_read(const std::vector<Tensor>& values) override {
    return cuda::begin_read(values);
  }
  bool native_bf16() const override { return true; }

  // -- conversions, products, element-wise -------------------------------------------------
  Tensor to_bf16(const Tensor& x) override { return cuda::to_bf16(x); }
  std::vector<Tensor> to_bf16_many(const std::vector<Tensor>& xs) override {
    return cuda::to_bf16_many(xs);
  }
  Tensor to_f32(const Tensor& x) override { return cuda::to_f32(x); }
  Tensor to_f16(const Tensor& x) override { return cuda::to_f16(x); }
  void fill_(Tensor& x, float value) override { cuda::fill_(x, value); }
  Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType out) override {
    return cuda::matmul(a, b, trans_a, trans_b, out);
  }
  void matmul_add_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a,
                   bool trans_b) override {
    cuda::matmul_add_(c, a, b, trans_a, trans_b);
  }
  Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) override {
    return cuda::bmm(a, b, trans_a, trans_b);
  }
  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType out,
                const Tensor& residual) override {
    return cuda::linear(x, w, bias, out, residual);
  }
  Tensor linear_param_grads_(Tensor& dw, const Tensor& g, const Tensor& x,
                             bool accumulate) override {
    return cuda::linear_param_grads_(dw, g, x, accumulate);
  }
  Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) override {
    return cuda::binary(op, a, b);
  }
  Tensor add_scalar(const Tensor& a, float s) override { return cuda::add_scalar(a, s); }
  Tensor mul_scalar(const Tensor& a, float s) override { return cuda::mul_scalar(a, s); }
  void axpy_(Tensor& y, float alpha, const Tensor& x) override { cuda::axpy_(y, alpha, x); }
  void scale_(Tensor& y, float alpha) override { cuda::scale_(y, alpha); }
  void scale_by_(Tensor& y, const Tensor& s) override { cuda::scale_by_(y, s); }
  Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                             const Tensor& y) override {
    return cuda::unary_backward_bf16(op, grad_y, x, y);
  }
  Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16) override {
    return cuda::unary_bf16(op, x, x_bf16);
  }
  Tensor unary(UnaryOp op, const Tensor& x) override { return cuda::unary(op, x); }
  Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                        const Tensor& y) override {
    return cuda::unary_backward(op, grad_y, x, y);
  }
  Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) override {
    return cuda::where(cond, a, b);
  }
  Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) override {
    return cuda::masked_fill(x, mask, value);
  }

  // -- reductions ----------------------------------------------------------------------------
  Tensor sum_all(const Tensor& x) override { return cuda::sum_all(x); }
  Tensor sum_squares(const Tensor& x) override { return cuda::sum_squares(x); }
  Tensor squared_norm(const std::vector<Tensor>& xs) override { return cuda::squared_norm(xs); }
  Tensor sum_dim(const Tensor& x, int dim, bool keepdim) override {
    return cuda::sum_dim(x, dim, keepdim);
  }
  Tensor sum_to(const Tensor& x, const Shape& shape) override { return cuda::sum_to(x, shape); }
  Tensor broadcast_to(const Tensor& x, const Shape& shape) override {
    return cuda::broadcast_to(x, shape);
  }
  Tensor argmax_last(const Tensor& x) override { return cuda::argmax_last(x); }
  Tensor count_matches(const Tensor& predicted, const Tensor& labels,
                       std::int64_t ignore_index) override {
    return cuda::count_matches(predicted, labels, ignore_index);
  }

  // -- layout --------------------------------------------------------------------------------
  Tensor transpose2d(const Tensor& x) override { return cuda::transpose2d(x); }
  Tensor permute(const Tensor& x, const std::vector<int>& perm) override {
    return cuda::permute(x, perm);
  }
  Tensor concat(const std::vector<Tensor>& xs, int dim) override { return cuda::concat(xs, dim); }
  Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length) override {
    return cuda::narrow_copy(x, dim, start, length);
  }
  void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part) override {
    cuda::narrow_add_(y, dim, start, part);
  }
  void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                       Tensor& v) override {
    cuda::split_qkv_heads(qkv, heads, dtype, q, k, v);
  }
  Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v) override {
    return cuda::merge_qkv_heads(q, k, v);
  }
  Tensor merge_qkv_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v) override {
    return cuda::merge_qkv_heads_bf16(q, k, v);
  }
  Tensor split_heads(const Tensor& x, std::int64_t heads) override {
    return cuda::split_heads(x, heads);
  }
  Tensor merge_heads(const Tensor& y) override { return cuda::merge_heads(y); }
  Tensor merge_heads_bf16(const Tensor& y, Tensor* y_bf16) override {
    return cuda::merge_heads_bf16(y, y_bf16);
  }
  Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices) override {
    return cuda::index_select0(x, indices);
  }

  // -- softmax, losses, attention --------------------------------------------------------------
  Tensor softmax(const Tensor& x, int dim) override { return cuda::softmax(x, dim); }
  Tensor log_softmax(const Tensor& x, int dim) override { return cuda::log_softmax(x, dim); }
  Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) override {
    return cuda::softmax_backward(grad_y, y, dim);
  }
  Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) override {
    return cuda::log_softmax_backward(grad_y, y, dim);
  }
  Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                               Tensor& stats, std::int64_t ignore_index,
                               Tensor* predicted) override {
    return cuda::cross_entropy_forward(logits, labels, label_smoothing, stats, ignore_index,
                                       predicted);
  }
  Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                float label_smoothing, const Tensor& grad,
                                std::int64_t ignore_index, bool overwrite_logits) override {
    return cuda::cross_entropy_backward(logits, stats, labels, label_smoothing, grad, ignore_index,
                                        overwrite_logits);
  }
  Tensor cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                      std::int64_t ignore_index, Tensor* predicted) override {
    return cuda::cross_entropy_with_gradient_(logits, labels, label_smoothing, ignore_index,
                                              predicted);
  }
  Tensor cross_entropy_backward_bf16(const Tensor& logits, const Tensor& stats,
                                     const Tensor& labels, float label_smoothing,
                                     const Tensor& grad, std::int64_t ignore_index,
                                     bool overwrite_logits) override {
    return cuda::cross_entropy_backward_bf16(logits, stats, labels, label_smoothing, grad,
                                             ignore_index, overwrite_logits);
  }
  Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           float scale, Tensor& lse) override {
    return cuda::attention_forward(q, k, v, causal, scale, lse);
  }
  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, bool causal, float scale,
                          Tensor* grad_q, Tensor* grad_k, Tensor* grad_v) override {
    cuda::attention_backward(grad_out, q, k, v, out, lse, causal, scale, grad_q, grad_k, grad_v);
  }
  Tensor packed_attention_forward_bf16(const Tensor& qkv, std::int64_t heads, bool causal,
                                       float scale, Tensor& lse) override {
    return cuda::packed_attention_forward_bf16(qkv, heads, causal, scale, lse);
  }
  Tensor packed_attention_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse, std::int64_t heads, bool causal, float scale,
                                   DType grad_dtype) override {
    return cuda::packed_attention_backward(grad_out, qkv, out, lse, heads, causal, scale,
                                           grad_dtype);
  }

  // -- normalization, embedding, optimizers -----------------------------------------------------
  Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                            const Tensor& bias, float eps, Tensor& save_mean,
                            Tensor& save_rstd) override {
    return cuda::layer_norm_forward(x, normalized, weight, bias, eps, save_mean, save_rstd);
  }
  Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                                 const Tensor& bias, float eps, Tensor& save_mean,
                                 Tensor& save_rstd, Tensor* x_bf16) override {
    return cuda::layer_norm_forward_bf16(x, normalized, weight, bias, eps, save_mean, save_rstd,
                                         x_bf16);
  }
  Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                     const Tensor& weight, const Tensor& bias, float eps,
                                     Tensor& sum, Tensor& save_mean, Tensor& save_rstd,
                                     Tensor* sum_bf16) override {
    return cuda::add_layer_norm_forward_bf16(a, b, normalized, weight, bias, eps, sum, save_mean,
                                             save_rstd, sum_bf16);
  }
  void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                           const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                           Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                           Tensor* grad_x_bf16) override {
    cuda::layer_norm_backward(grad_y, x, normalized, weight, save_mean, save_rstd, grad_x,
                              grad_weight, grad_bias, grad_x_bf16);
  }
  Tensor embedding_forward(const Tensor& table, const Tensor& indices) override {
    return cuda::embedding_forward(table, indices);
  }
  void embedding_backward(const Tensor& grad_y, const Tensor& indices,
                          Tensor& grad_table) override {
    cuda::embedding_backward(grad_y, indices, grad_table);
  }
  void adam_step_(const AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                  Tensor& vmax) override {
    cuda::adam_step_(s, p, g, m, v, vmax);
  }
  void adam_step_multi_(const AdamStep& s, const std::vector<Tensor>& params,
                        const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                        const std::vector<Tensor>& exp_avg_sq,
                        const std::vector<Tensor>& max_exp_avg_sq, const Tensor& grad_norm_sq,
                        float max_norm, const Tensor& halted) override {
    cuda::adam_step_multi_(s, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, grad_norm_sq,
                           max_norm, halted);
  }
  void halt_unless_finite_(Tensor& halted, const Tensor& value) override {
    cuda::halt_unless_finite_(halted, value);
  }
  void sgd_step_(const SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf) override {
    cuda::sgd_step_(s, p, g, buf);
  }

  // -- convolution (cuDNN), pooling, batch norm, distillation losses --------------------------
  Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                        const Conv2dParams& p) override {
    return cuda::conv2d_forward(x, w, bias, p);
  }
  void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                       const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                       Tensor* grad_bias) override {
    cuda::conv2d_backward(grad_y, x, w, p, grad_x, grad_w, grad_bias);
  }
  Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax) override {
    return cuda::max_pool2d_forward(x, p, argmax);
  }
  Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax,
                             const Shape& x_shape) override {
    return cuda::max_pool2d_backward(grad_y, argmax, x_shape);
  }
  // The fused op as its parts, as the CPU's fallback composes it: the convolution with its ReLU
  // (cuDNN), then the pooling; backward, the unpooled gradient into the convolution's.
  Tensor conv2d_relu_max_pool2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                        const Conv2dParams& p, const Pool2dParams& pool,
                                        Tensor& argmax) override {
    Conv2dParams relu = p;
    relu.relu = true;
    return cuda::max_pool2d_forward(cuda::conv2d_forward(x, w, bias, relu), pool, argmax);
  }
  void conv2d_relu_max_pool2d_backward(const Tensor& grad_pooled, const Tensor& argmax,
                                       const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                       const Pool2dParams& pool, Tensor* grad_x, Tensor* grad_w,
                                       Tensor* grad_bias) override {
    const std::int64_t oh = (x.size(2) + 2 * p.pad_h - w.size(2)) / p.stride_h + 1;
    const std::int64_t ow = (x.size(3) + 2 * p.pad_w - w.size(3)) / p.stride_w + 1;
    (void)pool;  // the argmax holds the windows' winners
    cuda::conv2d_backward(
        cuda::max_pool2d_backward(grad_pooled, argmax, Shape{x.size(0), w.size(0), oh, ow}), x, w,
        p, grad_x, grad_w, grad_bias);
  }
  Tensor avg_pool2d_forward(const Tensor& x, const Pool2dParams& p) override {
    return cuda::avg_pool2d_forward(x, p);
  }
  Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape,
                             const Pool2dParams& p) override {
    return cuda::avg_pool2d_backward(grad_y, x_shape, p);
  }
  Tensor batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            Tensor& running_mean, Tensor& running_var, bool training,
                            float momentum, float eps, Tensor& save_mean,
                            Tensor& save_invstd) override {
    return cuda::batch_norm_forward(x, weight, bias, running_mean, running_var, training, momentum,
                                    eps, save_mean, save_invstd);
  }
  void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                           const Tensor& save_mean, const Tensor& save_invstd, bool training,
                           Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) override {
    cuda::batch_norm_backward(grad_y, x, weight, save_mean, save_invstd, training, grad_x,
                              grad_weight, grad_bias);
  }
  void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x) override {
    cuda::channel_moments_(sum, sum_squares, x);
  }
  void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                             const Tensor& sum_squares, std::int64_t count,
                             float momentum) override {
    cuda::running_stats_update_(running_mean, running_var, sum, sum_squares, count, momentum);
  }
  Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& labels) override {
    return cuda::nll_loss_forward(log_probs, labels);
  }
  Tensor nll_loss_backward(const Tensor& grad, const Tensor& labels, const Shape& shape) override {
    return cuda::nll_loss_backward(grad, labels, shape);
  }
  Tensor kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs) override {
    return cuda::kl_div_forward(input_log_probs, target_probs);
  }
  void kl_div_backward(const Tensor& grad, const Tensor& input_log_probs,
                       const Tensor& target_probs, Tensor* grad_input,
                       Tensor* grad_target) override {
    cuda::kl_div_backward(grad, input_log_probs, target_probs, grad_input, grad_target);
  }

  // -- on the host for now (host_fallback.h) ---------------------------------------------------
  // The CPU's generator draws the mask, so a run on the GPU drops the same units as on the CPU
  // from the same seed.
  Tensor dropout_mask(const Shape& shape, float p, Generator& gen) override {
    HostFallback h;
    return h.out(h.cpu().dropout_mask(shape, p, gen));
  }
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend() { return std::make_shared<CudaBackend>(); }

}  // namespace hpm
