// Backend: how ops run on one type of device. An op is written once as what it means (its shapes,
// dtypes and, in autograd, its gradient rule) and once per backend as how it runs. kernels.h's
// functions are the ops' one entry point: each finds the backend of its inputs' device type here
// (mixing device ids is an error naming both), makes their device current so that outputs are
// allocated there, and calls the backend. The dtype is the backend's business: matmul of two BF16
// tensors is a bf16 product on every backend, with no dtype in the op's name.
//
// A new backend is a folder under src/tensor/backend/ with a class implementing this interface
// and a register_backend() call (the CPU's: backend/cpu/cpu_backend.cpp). Nothing above the
// tensor layer changes.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "hpm/tensor/device.h"
#include "hpm/tensor/op_params.h"
#include "hpm/tensor/tensor.h"

namespace hpm {

class Generator;

// Every op of the Backend interface, for dispatch accounting (the conformance test checks that
// it ran each one on every backend).
enum class Op : int {
  kToBf16,
  kToF32,
  kToF16,
  kFill,
  kMatmul,
  kMatmulAdd,
  kBmm,
  kLinear,
  kLinearParamGrads,
  kBinary,
  kAddScalar,
  kMulScalar,
  kAxpy,
  kScale,
  kUnary,
  kUnaryBackward,
  kUnaryBf16,
  kUnaryBackwardBf16,
  kSumAll,
  kSumSquares,
  kSumDim,
  kSumTo,
  kBroadcastTo,
  kArgmaxLast,
  kCountMatches,
  kSoftmax,
  kLogSoftmax,
  kSoftmaxBackward,
  kLogSoftmaxBackward,
  kCrossEntropyForward,
  kCrossEntropyBackward,
  kCrossEntropyBackwardBf16,
  kAttentionForward,
  kAttentionBackward,
  kPackedAttentionForwardBf16,
  kPackedAttentionBackward,
  kTranspose2d,
  kPermute,
  kConcat,
  kNarrowCopy,
  kNarrowAdd,
  kSplitQkvHeads,
  kMergeQkvHeads,
  kMergeQkvHeadsBf16,
  kSplitHeads,
  kMergeHeads,
  kMergeHeadsBf16,
  kWhere,
  kMaskedFill,
  kIndexSelect0,
  kConv2dForward,
  kConv2dBackward,
  kMaxPool2dForward,
  kMaxPool2dBackward,
  kConv2dReluMaxPool2dForward,
  kConv2dReluMaxPool2dBackward,
  kAvgPool2dForward,
  kAvgPool2dBackward,
  kBatchNormForward,
  kBatchNormBackward,
  kLayerNormForward,
  kLayerNormForwardBf16,
  kAddLayerNormForwardBf16,
  kLayerNormBackward,
  kEmbeddingForward,
  kEmbeddingBackward,
  kAdamStep,
  kAdamStepMulti,
  kSgdStep,
  kNllLossForward,
  kNllLossBackward,
  kKlDivForward,
  kKlDivBackward,
  kChannelMoments,
  kRunningStatsUpdate,
  kSquaredNorm,
  kDropoutMask,
  kToBf16Many,
  kCrossEntropyWithGradient,
  kScaleBy,
  kHaltUnlessFinite,
};
inline constexpr int kOps = 81;
const char* op_name(Op op);

// A read of device values to the host under way (Backend::begin_read).
class PendingRead {
 public:
  virtual ~PendingRead() = default;
  // The values as host (CPU) tensors, in order, once the device has run the work issued before
  // the read began; called once.
  virtual std::vector<Tensor> wait() = 0;
};

class Backend {
 public:
  using AdamStep = kernels::AdamStep;
  using BinaryOp = kernels::BinaryOp;
  using Conv2dParams = kernels::Conv2dParams;
  using Pool2dParams = kernels::Pool2dParams;
  using SgdStep = kernels::SgdStep;
  using UnaryOp = kernels::UnaryOp;

  virtual ~Backend() = default;
  virtual DeviceType type() const = 0;

  // -- the device: memory, streams, copies --------------------------------------------------
  // Whether the host may touch this type's memory directly (Tensor::data works on it).
  virtual bool is_host() const = 0;
  virtual std::shared_ptr<MemoryResource> memory(int index) = 0;
  virtual std::unique_ptr<Stream> make_stream(DeviceId id) = 0;
  // Copies bytes between two devices of which at least one is of this type (the other may be the
  // CPU), ordered after the work issued to both; returns when the host may reuse `src` if it is
  // host memory.
  virtual void copy_bytes(void* dst, const Device& dst_device, const void* src,
                          const Device& src_device, std::size_t bytes) = 0;
  // Begins copying `values` (tensors on one device of this type) to the host in the device's order
  // of work and returns at once: the read's wait() waits for the work issued before it, not for
  // what is issued after (host_read.h). By default the copies are made now.
  virtual std::unique_ptr<PendingRead> begin_read(const std::vector<Tensor>& values);
  // Whether bf16 products run natively (faster than f32); autocast to bf16 requires it.
  virtual bool native_bf16() const = 0;

  // -- ops (kernels.h documents each) -----------------------------------------------------
  virtual Tensor to_bf16(const Tensor& x) = 0;
  // to_bf16 of each (a device may convert them all in one launch); here, one to_bf16 each.
  virtual std::vector<Tensor> to_bf16_many(const std::vector<Tensor>& xs) {
    std::vector<Tensor> ys;
    ys.reserve(xs.size());
    for (const Tensor& x : xs) ys.push_back(to_bf16(x));
    return ys;
  }
  virtual Tensor to_f32(const Tensor& x) = 0;
  virtual Tensor to_f16(const Tensor& x) = 0;
  virtual void fill_(Tensor& x, float value) = 0;
  virtual Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                        DType out) = 0;
  virtual void matmul_add_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a,
                           bool trans_b) = 0;
  virtual Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) = 0;
  virtual Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType out,
                        const Tensor& residual) = 0;
  virtual Tensor linear_param_grads_(Tensor& dw, const Tensor& g, const Tensor& x,
                                     bool accumulate) = 0;
  virtual Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) = 0;
  virtual Tensor add_scalar(const Tensor& a, float s) = 0;
  virtual Tensor mul_scalar(const Tensor& a, float s) = 0;
  virtual void axpy_(Tensor& y, float alpha, const Tensor& x) = 0;
  virtual void scale_(Tensor& y, float alpha) = 0;
  virtual void scale_by_(Tensor& y, const Tensor& s) = 0;
  virtual Tensor unary(UnaryOp op, const Tensor& x) = 0;
  virtual Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                                const Tensor& y) = 0;
  virtual Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16) = 0;
  virtual Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                                     const Tensor& y) = 0;
  virtual Tensor sum_all(const Tensor& x) = 0;
  virtual Tensor sum_squares(const Tensor& x) = 0;
  virtual Tensor sum_dim(const Tensor& x, int dim, bool keepdim) = 0;
  virtual Tensor sum_to(const Tensor& x, const Shape& shape) = 0;
  virtual Tensor broadcast_to(const Tensor& x, const Shape& shape) = 0;
  virtual Tensor argmax_last(const Tensor& x) = 0;
  virtual Tensor count_matches(const Tensor& predicted, const Tensor& labels,
                               std::int64_t ignore_index) = 0;
  virtual Tensor softmax(const Tensor& x, int dim) = 0;
  virtual Tensor log_softmax(const Tensor& x, int dim) = 0;
  virtual Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) = 0;
  virtual Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) = 0;
  virtual Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                       float label_smoothing, Tensor& stats,
                                       std::int64_t ignore_index, Tensor* predicted) = 0;
  virtual Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats,
                                        const Tensor& labels, float label_smoothing,
                                        const Tensor& grad, std::int64_t ignore_index,
                                        bool overwrite_logits) = 0;
  virtual Tensor cross_entropy_backward_bf16(const Tensor& logits, const Tensor& stats,
                                             const Tensor& labels, float label_smoothing,
                                             const Tensor& grad, std::int64_t ignore_index,
                                             bool overwrite_logits) = 0;
  virtual Tensor cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels,
                                              float label_smoothing, std::int64_t ignore_index,
                                              Tensor* predicted) = 0;
  virtual Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                   float scale, Tensor& lse) = 0;
  virtual void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  bool causal, float scale, Tensor* grad_q, Tensor* grad_k,
                                  Tensor* grad_v) = 0;
  virtual Tensor packed_attention_forward_bf16(const Tensor& qkv, std::int64_t heads, bool causal,
                                               float scale, Tensor& lse) = 0;
  virtual Tensor packed_attention_backward(const Tensor& grad_out, const Tensor& qkv,
                                           const Tensor& out, const Tensor& lse, std::int64_t heads,
                                           bool causal, float scale, DType grad_dtype) = 0;
  virtual Tensor transpose2d(const Tensor& x) = 0;
  virtual Tensor permute(const Tensor& x, const std::vector<int>& perm) = 0;
  virtual Tensor concat(const std::vector<Tensor>& xs, int dim) = 0;
  virtual Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length) = 0;
  virtual void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part) = 0;
  virtual void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q,
                               Tensor& k, Tensor& v) = 0;
  virtual Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  virtual Tensor merge_qkv_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  virtual Tensor split_heads(const Tensor& x, std::int64_t heads) = 0;
  virtual Tensor merge_heads(const Tensor& y) = 0;
  virtual Tensor merge_heads_bf16(const Tensor& y, Tensor* y_bf16) = 0;
  virtual Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) = 0;
  virtual Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) = 0;
  virtual Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices) = 0;
  virtual Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                const Conv2dParams& p) = 0;
  virtual void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                               const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                               Tensor* grad_bias) = 0;
  virtual Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax) = 0;
  virtual Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax,
                                     const Shape& x_shape) = 0;
  virtual Tensor conv2d_relu_max_pool2d_forward(const Tensor& x, const Tensor& w,
                                                const Tensor& bias, const Conv2dParams& p,
                                                const Pool2dParams& pool, Tensor& argmax) = 0;
  virtual void conv2d_relu_max_pool2d_backward(const Tensor& grad_pooled, const Tensor& argmax,
                                               const Tensor& x, const Tensor& w,
                                               const Conv2dParams& p, const Pool2dParams& pool,
                                               Tensor* grad_x, Tensor* grad_w,
                                               Tensor* grad_bias) = 0;
  virtual Tensor avg_pool2d_forward(const Tensor& x, const Pool2dParams& p) = 0;
  virtual Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape,
                                     const Pool2dParams& p) = 0;
  virtual Tensor batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    Tensor& running_mean, Tensor& running_var, bool training,
                                    float momentum, float eps, Tensor& save_mean,
                                    Tensor& save_invstd) = 0;
  virtual void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd,
                                   bool training, Tensor* grad_x, Tensor* grad_weight,
                                   Tensor* grad_bias) = 0;
  virtual Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                                    const Tensor& bias, float eps, Tensor& save_mean,
                                    Tensor& save_rstd) = 0;
  virtual Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized,
                                         const Tensor& weight, const Tensor& bias, float eps,
                                         Tensor& save_mean, Tensor& save_rstd, Tensor* x_bf16) = 0;
  virtual Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b,
                                             std::int64_t normalized, const Tensor& weight,
                                             const Tensor& bias, float eps, Tensor& sum,
                                             Tensor& save_mean, Tensor& save_rstd,
                                             Tensor* sum_bf16) = 0;
  virtual void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                                   const Tensor& weight, const Tensor& save_mean,
                                   const Tensor& save_rstd, Tensor* grad_x, Tensor* grad_weight,
                                   Tensor* grad_bias, Tensor* grad_x_bf16) = 0;
  virtual Tensor embedding_forward(const Tensor& table, const Tensor& indices) = 0;
  virtual void embedding_backward(const Tensor& grad_y, const Tensor& indices,
                                  Tensor& grad_table) = 0;
  virtual void adam_step_(const AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                          Tensor& vmax) = 0;
  virtual void adam_step_multi_(const AdamStep& s, const std::vector<Tensor>& params,
                                const std::vector<Tensor>& grads,
                                const std::vector<Tensor>& exp_avg,
                                const std::vector<Tensor>& exp_avg_sq,
                                const std::vector<Tensor>& max_exp_avg_sq,
                                const Tensor& grad_norm_sq, float max_norm,
                                const Tensor& halted) = 0;
  virtual void halt_unless_finite_(Tensor& halted, const Tensor& value) = 0;
  virtual void sgd_step_(const SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf) = 0;
  virtual Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& labels) = 0;
  virtual Tensor nll_loss_backward(const Tensor& grad, const Tensor& labels,
                                   const Shape& shape) = 0;
  virtual Tensor kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs) = 0;
  virtual void kl_div_backward(const Tensor& grad, const Tensor& input_log_probs,
                               const Tensor& target_probs, Tensor* grad_input,
                               Tensor* grad_target) = 0;
  virtual void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x) = 0;
  virtual void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                                     const Tensor& sum_squares, std::int64_t count,
                                     float momentum) = 0;
  virtual Tensor squared_norm(const std::vector<Tensor>& xs) = 0;
  virtual Tensor dropout_mask(const Shape& shape, float p, Generator& gen) = 0;
};

// Makes `backend` the one of its type (replacing any). The CPU's is registered from the start.
void register_backend(std::shared_ptr<Backend> backend);
bool has_backend(DeviceType type);
// Throws std::runtime_error naming the type when none is registered (a build without CUDA).
Backend& backend(DeviceType type);
// How many times `op` was dispatched to the backend of `type` since the process started.
std::uint64_t dispatch_count(DeviceType type, Op op);
// The name of the op the calling thread dispatched last (nullptr before any): errors that
// surface after the op returned (a GPU kernel's fault, reported at the next synchronization) name
// it.
const char* last_dispatched_op();

// The CPU backend (src/tensor/backend/cpu/), registered under `type`: kCpu, or kPrivateUse for
// the conformance test's second device type.
std::shared_ptr<Backend> make_cpu_backend(DeviceType type = DeviceType::kCpu);
// The CUDA backend (src/tensor/backend/cuda/), registered from the start in a build with
// HPM_CUDA; it touches the driver only when a cuda:N Device is made, which throws saying what
// was found (no driver, no device, fewer devices) on a machine without that GPU.
std::shared_ptr<Backend> make_cuda_backend();

}  // namespace hpm
