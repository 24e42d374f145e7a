// The ops' one entry point: find the backend of the inputs' device, check they share one device
// id, make their device current for the outputs, count, call.
#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "hpm/tensor/backend.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/op_profile.h"

namespace hpm {

namespace {

struct Registry {
  std::mutex mu;
  std::array<std::shared_ptr<Backend>, kDeviceTypes> owned;
  std::array<std::atomic<Backend*>, kDeviceTypes> backends{};
  std::array<std::array<std::atomic<std::uint64_t>, kOps>, kDeviceTypes> counts{};

  Registry() {
    owned[0] = make_cpu_backend(DeviceType::kCpu);
    backends[0] = owned[0].get();
#ifdef HPM_HAVE_CUDA
    constexpr auto cuda = static_cast<std::size_t>(DeviceType::kCuda);
    owned[cuda] = make_cuda_backend();
    backends[cuda] = owned[cuda].get();
#endif
  }
};

Registry& registry() {
  // Leaked on purpose: ops may run during static destruction (tensors in static storage).
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

const char* op_name(Op op) {
  static const char* const names[kOps] = {
      "to_bf16",
      "to_f32",
      "to_f16",
      "fill_",
      "matmul",
      "matmul_add_",
      "bmm",
      "linear",
      "linear_param_grads_",
      "binary",
      "add_scalar",
      "mul_scalar",
      "axpy_",
      "scale_",
      "unary",
      "unary_backward",
      "unary_bf16",
      "unary_backward_bf16",
      "sum_all",
      "sum_squares",
      "sum_dim",
      "sum_to",
      "broadcast_to",
      "argmax_last",
      "count_matches",
      "softmax",
      "log_softmax",
      "softmax_backward",
      "log_softmax_backward",
      "cross_entropy_forward",
      "cross_entropy_backward",
      "cross_entropy_backward_bf16",
      "attention_forward",
      "attention_backward",
      "packed_attention_forward_bf16",
      "packed_attention_backward",
      "transpose2d",
      "permute",
      "concat",
      "narrow_copy",
      "narrow_add_",
      "split_qkv_heads",
      "merge_qkv_heads",
      "merge_qkv_heads_bf16",
      "split_heads",
      "merge_heads",
      "merge_heads_bf16",
      "where",
      "masked_fill",
      "index_select0",
      "conv2d_forward",
      "conv2d_backward",
      "max_pool2d_forward",
      "max_pool2d_backward",
      "conv2d_relu_max_pool2d_forward",
      "conv2d_relu_max_pool2d_backward",
      "avg_pool2d_forward",
      "avg_pool2d_backward",
      "batch_norm_forward",
      "batch_norm_backward",
      "layer_norm_forward",
      "layer_norm_forward_bf16",
      "add_layer_norm_forward_bf16",
      "layer_norm_backward",
      "embedding_forward",
      "embedding_backward",
      "adam_step_",
      "adam_step_multi_",
      "sgd_step_",
      "nll_loss_forward",
      "nll_loss_backward",
      "kl_div_forward",
      "kl_div_backward",
      "channel_moments_",
      "running_stats_update_",
      "squared_norm",
      "dropout_mask",
      "to_bf16_many",
      "cross_entropy_with_gradient_",
      "scale_by_",
      "halt_unless_finite_",
  };
  return names[static_cast<int>(op)];
}

void register_backend(std::shared_ptr<Backend> b) {
  Registry& r = registry();
  const auto t = static_cast<std::size_t>(b->type());
  std::lock_guard lock(r.mu);
  r.backends[t] = b.get();
  // The replaced backend stays alive: tensors of its type may still be in flight somewhere.
  static std::vector<std::shared_ptr<Backend>>* retired =
      new std::vector<std::shared_ptr<Backend>>();
  if (r.owned[t]) retired->push_back(std::move(r.owned[t]));
  r.owned[t] = std::move(b);
}

bool has_backend(DeviceType type) {
  return registry().backends[static_cast<std::size_t>(type)].load() != nullptr;
}

Backend& backend(DeviceType type) {
  Backend* b = registry().backends[static_cast<std::size_t>(type)].load();
  if (b == nullptr) {
    throw std::runtime_error(std::string("no backend for device type '") + device_type_name(type) +
                             "' in this build");
  }
  return *b;
}

namespace {
thread_local const char* last_op = nullptr;
}  // namespace

const char* last_dispatched_op() { return last_op; }

std::uint64_t dispatch_count(DeviceType type, Op op) {
  return registry().counts[static_cast<std::size_t>(type)][static_cast<std::size_t>(op)].load();
}

namespace kernels {
namespace {

// One op's dispatch: the backend of its inputs' device, which becomes current (so that the
// backend allocates the outputs there) unless the current device already has that id (a pipeline
// stage's own CPU Device stays current, keeping its accounting).
class OpScope {
 public:
  OpScope(Op op, std::initializer_list<const Tensor*> inputs) : op_(op) {
    int at = 0;
    for (const Tensor* t : inputs) {
      see(*t, at++);
    }
    finish();
  }
  OpScope(Op op, const std::vector<Tensor>& inputs) : op_(op) {
    int at = 0;
    for (const Tensor& t : inputs) see(t, at++);
    finish();
  }
  ~OpScope() {
    if (counted_) detail::note_op_end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  Backend& backend() const { return *backend_; }
  // The function a binary or unary op applies, for the op profile.
  void set_detail(const char* detail) {
    if (profile_) profile_->set_detail(detail);
  }
  // A product's M x N x K, for the op profile (made only while it records): each shape of a
  // step's products its own row.
  void set_product_detail(std::int64_t m, std::int64_t n, std::int64_t k) {
    if (!profile_ || !profile_->active()) return;
    profile_->set_detail(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
  }

 private:
  void see(const Tensor& t, int at) {
    if (!t.defined()) return;
    Device& d = t.device();
    if (device_ == nullptr) {
      device_ = &d;
      first_ = at;
      dtype_ = t.dtype();
    } else if (d.id() != device_->id()) {
      throw std::invalid_argument(std::string(op_name(op_)) +
                                  ": inputs on different devices: " + device_->id().str() +
                                  " (input " + std::to_string(first_ + 1) + ") and " +
                                  d.id().str() + " (input " + std::to_string(at + 1) + ")");
    }
  }
  void finish() {
    Device& current = Device::current();
    if (device_ == nullptr) device_ = &current;
    const DeviceId id = device_->id();
    if (current.id() != id) guard_.emplace(*device_);
    backend_ = &hpm::backend(id.type);
    last_op = op_name(op_);
    detail::note_op_begin();
    counted_ = true;
    ++registry().counts[static_cast<std::size_t>(id.type)][static_cast<std::size_t>(op_)];
    if (op_profile::detail::on.load(std::memory_order_relaxed))
      profile_.emplace(op_name(op_), dtype_, *device_);
  }

  Op op_;
  Device* device_ = nullptr;
  int first_ = 0;
  DType dtype_ = DType::F32;
  bool counted_ = false;
  Backend* backend_ = nullptr;
  std::optional<DeviceGuard> guard_;
  std::optional<op_profile::Scope> profile_;  // last: its end is recorded before anything else
};

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return "add";
    case BinaryOp::Sub:
      return "sub";
    case BinaryOp::Mul:
      return "mul";
    case BinaryOp::Div:
      return "div";
  }
  return "?";
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
      return "neg";
    case UnaryOp::Exp:
      return "exp";
    case UnaryOp::Log:
      return "log";
    case UnaryOp::Sqrt:
      return "sqrt";
    case UnaryOp::Relu:
      return "relu";
    case UnaryOp::Tanh:
      return "tanh";
    case UnaryOp::Sigmoid:
      return "sigmoid";
    case UnaryOp::Gelu:
      return "gelu";
    case UnaryOp::GeluTanh:
      return "gelu_tanh";
    case UnaryOp::Square:
      return "square";
  }
  return "?";
}

}  // namespace

bool native_bf16() { return hpm::backend(Device::current().id().type).native_bf16(); }

Tensor to_bf16(const Tensor& x) {
  OpScope scope(Op::kToBf16, {&x});
  return scope.backend().to_bf16(x);
}

std::vector<Tensor> to_bf16_many(const std::vector<Tensor>& xs) {
  OpScope scope(Op::kToBf16Many, xs);
  return scope.backend().to_bf16_many(xs);
}

Tensor to_f32(const Tensor& x) {
  OpScope scope(Op::kToF32, {&x});
  return scope.backend().to_f32(x);
}

Tensor to_f16(const Tensor& x) {
  OpScope scope(Op::kToF16, {&x});
  return scope.backend().to_f16(x);
}

void fill_(Tensor& x, float value) {
  OpScope scope(Op::kFill, {&x});
  scope.backend().fill_(x, value);
}

namespace {

// A product's output dtype: F32, or BF16 from BF16 operands.
void check_product_out(const char* op, const Tensor& a, const Tensor& b, DType out) {
  if (out == DType::F32) return;
  if (out != DType::BF16 || a.dtype() != DType::BF16 || b.dtype() != DType::BF16) {
    throw std::invalid_argument(std::string(op) + ": a " + dtype_name(out) + " output from " +
                                dtype_name(a.dtype()) + " and " + dtype_name(b.dtype()) +
                                " operands (F32 always, BF16 from BF16 operands)");
  }
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType out) {
  OpScope scope(Op::kMatmul, {&a, &b});
  check_product_out("matmul", a, b, out);
  if (a.dim() == 2 && b.dim() == 2) {
    scope.set_product_detail(a.size(trans_a ? 1 : 0), b.size(trans_b ? 0 : 1),
                             a.size(trans_a ? 0 : 1));
  }
  return scope.backend().matmul(a, b, trans_a, trans_b, out);
}

void matmul_add_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  OpScope scope(Op::kMatmulAdd, {&c, &a, &b});
  scope.backend().matmul_add_(c, a, b, trans_a, trans_b);
}

Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  OpScope scope(Op::kBmm, {&a, &b});
  return scope.backend().bmm(a, b, trans_a, trans_b);
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType out,
              const Tensor& residual) {
  OpScope scope(Op::kLinear, {&x, &w, &bias, &residual});
  check_product_out("linear", x, w, out);
  if (residual.defined()) {
    if (out != DType::F32 || residual.dtype() != DType::F32 || x.dim() != 2 || w.dim() != 2 ||
        residual.shape() != Shape{x.size(0), w.size(0)}) {
      throw std::invalid_argument("linear: a residual needs F32 (" + std::to_string(x.size(0)) +
                                  ", " + std::to_string(w.dim() == 2 ? w.size(0) : -1) +
                                  ") beside an F32 output, got " + dtype_name(residual.dtype()) +
                                  " " + residual.shape().str());
    }
  }
  if (x.dim() >= 1 && w.dim() == 2 && x.size(-1) > 0) {
    scope.set_product_detail(x.numel() / x.size(-1), w.size(0), w.size(1));
  }
  return scope.backend().linear(x, w, bias, out, residual);
}

Tensor linear_param_grads_(Tensor& dw, const Tensor& g, const Tensor& x, bool accumulate) {
  // The shapes here for every backend; the dtypes are each backend's.
  if (g.dim() != 2 || x.dim() != 2 || g.size(0) != x.size(0)) {
    throw std::invalid_argument("linear_param_grads_: gradient " + g.shape().str() + " and input " +
                                x.shape().str() + " need the same rows");
  }
  if (dw.shape() != Shape{g.size(1), x.size(1)} || dw.dtype() != DType::F32) {
    throw std::invalid_argument("linear_param_grads_ weight gradient: expected F32 " +
                                Shape{g.size(1), x.size(1)}.str() + ", got " +
                                dtype_name(dw.dtype()) + " " + dw.shape().str());
  }
  OpScope scope(Op::kLinearParamGrads, {&dw, &g, &x});
  scope.set_product_detail(g.size(1), x.size(1), g.size(0));
  return scope.backend().linear_param_grads_(dw, g, x, accumulate);
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  OpScope scope(Op::kBinary, {&a, &b});
  scope.set_detail(binary_name(op));
  return scope.backend().binary(op, a, b);
}

Tensor add_scalar(const Tensor& a, float s) {
  OpScope scope(Op::kAddScalar, {&a});
  return scope.backend().add_scalar(a, s);
}

Tensor mul_scalar(const Tensor& a, float s) {
  OpScope scope(Op::kMulScalar, {&a});
  return scope.backend().mul_scalar(a, s);
}

void axpy_(Tensor& y, float alpha, const Tensor& x) {
  OpScope scope(Op::kAxpy, {&y, &x});
  scope.backend().axpy_(y, alpha, x);
}

void scale_(Tensor& y, float alpha) {
  OpScope scope(Op::kScale, {&y});
  scope.backend().scale_(y, alpha);
}

void scale_by_(Tensor& y, const Tensor& s) {
  if (s.numel() != 1 || s.dtype() != DType::F32 ||
      (y.dtype() != DType::F32 && y.dtype() != DType::BF16)) {
    throw std::invalid_argument(
        "scale_by_: expected an F32 or BF16 tensor and a one-element F32 "
        "scale, got " +
        y.shape().str() + " " + dtype_name(y.dtype()) + " and " + s.shape().str() + " " +
        dtype_name(s.dtype()));
  }
  OpScope scope(Op::kScaleBy, {&y, &s});
  scope.backend().scale_by_(y, s);
}

Tensor unary(UnaryOp op, const Tensor& x) {
  OpScope scope(Op::kUnary, {&x});
  scope.set_detail(unary_name(op));
  return scope.backend().unary(op, x);
}

Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y) {
  OpScope scope(Op::kUnaryBackwardBf16, {&grad_y, &x, &y});
  scope.set_detail(unary_name(op));
  return scope.backend().unary_backward_bf16(op, grad_y, x, y);
}

Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16) {
  OpScope scope(Op::kUnaryBf16, {&x});
  scope.set_detail(unary_name(op));
  return scope.backend().unary_bf16(op, x, x_bf16);
}

Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y) {
  OpScope scope(Op::kUnaryBackward, {&grad_y, &x, &y});
  scope.set_detail(unary_name(op));
  return scope.backend().unary_backward(op, grad_y, x, y);
}

Tensor sum_all(const Tensor& x) {
  OpScope scope(Op::kSumAll, {&x});
  return scope.backend().sum_all(x);
}

Tensor sum_squares(const Tensor& x) {
  OpScope scope(Op::kSumSquares, {&x});
  return scope.backend().sum_squares(x);
}

Tensor sum_dim(const Tensor& x, int dim, bool keepdim) {
  OpScope scope(Op::kSumDim, {&x});
  return scope.backend().sum_dim(x, dim, keepdim);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  OpScope scope(Op::kSumTo, {&x});
  return scope.backend().sum_to(x, shape);
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  OpScope scope(Op::kBroadcastTo, {&x});
  return scope.backend().broadcast_to(x, shape);
}

Tensor argmax_last(const Tensor& x) {
  OpScope scope(Op::kArgmaxLast, {&x});
  return scope.backend().argmax_last(x);
}

Tensor count_matches(const Tensor& predicted, const Tensor& labels, std::int64_t ignore_index) {
  if (predicted.dtype() != DType::I64 || labels.dtype() != DType::I64 ||
      predicted.numel() != labels.numel()) {
    throw std::invalid_argument("count_matches: predictions " + predicted.shape().str() + " " +
                                dtype_name(predicted.dtype()) + " against labels " +
                                labels.shape().str() + " " + dtype_name(labels.dtype()) +
                                " (both I64, of one size)");
  }
  OpScope scope(Op::kCountMatches, {&predicted, &labels});
  return scope.backend().count_matches(predicted, labels, ignore_index);
}

Tensor softmax(const Tensor& x, int dim) {
  OpScope scope(Op::kSoftmax, {&x});
  return scope.backend().softmax(x, dim);
}

Tensor log_softmax(const Tensor& x, int dim) {
  OpScope scope(Op::kLogSoftmax, {&x});
  return scope.backend().log_softmax(x, dim);
}

Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  OpScope scope(Op::kSoftmaxBackward, {&grad_y, &y});
  return scope.backend().softmax_backward(grad_y, y, dim);
}

Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) {
  OpScope scope(Op::kLogSoftmaxBackward, {&grad_y, &y});
  return scope.backend().log_softmax_backward(grad_y, y, dim);
}

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                             Tensor& stats, std::int64_t ignore_index, Tensor* predicted) {
  OpScope scope(Op::kCrossEntropyForward, {&logits, &labels});
  return scope.backend().cross_entropy_forward(logits, labels, label_smoothing, stats, ignore_index,
                                               predicted);
}

namespace {

void check_cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                  const char* op) {
  if (stats.dtype() != DType::F32 || stats.numel() != 2 * labels.numel() ||
      logits.numel() != labels.numel() * (logits.dim() > 0 ? logits.size(-1) : 0)) {
    throw std::invalid_argument(std::string(op) + ": logits " + logits.shape().str() + ", stats " +
                                stats.shape().str() + " and labels " + labels.shape().str() +
                                " do not belong together");
  }
}

}  // namespace

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                              float label_smoothing, const Tensor& grad, std::int64_t ignore_index,
                              bool overwrite_logits) {
  check_cross_entropy_backward(logits, stats, labels, "cross_entropy_backward");
  OpScope scope(Op::kCrossEntropyBackward, {&logits, &stats, &labels, &grad});
  return scope.backend().cross_entropy_backward(logits, stats, labels, label_smoothing, grad,
                                                ignore_index, overwrite_logits);
}

Tensor cross_entropy_backward_bf16(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                   float label_smoothing, const Tensor& grad,
                                   std::int64_t ignore_index, bool overwrite_logits) {
  check_cross_entropy_backward(logits, stats, labels, "cross_entropy_backward_bf16");
  OpScope scope(Op::kCrossEntropyBackwardBf16, {&logits, &stats, &labels, &grad});
  return scope.backend().cross_entropy_backward_bf16(logits, stats, labels, label_smoothing, grad,
                                                     ignore_index, overwrite_logits);
}

Tensor cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                    std::int64_t ignore_index, Tensor* predicted) {
  OpScope scope(Op::kCrossEntropyWithGradient, {&logits, &labels});
  return scope.backend().cross_entropy_with_gradient_(logits, labels, label_smoothing, ignore_index,
                                                      predicted);
}

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& lse) {
  OpScope scope(Op::kAttentionForward, {&q, &k, &v});
  return scope.backend().attention_forward(q, k, v, causal, scale, lse);
}

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, float scale,
                        Tensor* grad_q, Tensor* grad_k, Tensor* grad_v) {
  OpScope scope(Op::kAttentionBackward, {&grad_out, &q, &k, &v, &out});
  scope.backend().attention_backward(grad_out, q, k, v, out, lse, causal, scale, grad_q, grad_k,
                                     grad_v);
}

Tensor transpose2d(const Tensor& x) {
  OpScope scope(Op::kTranspose2d, {&x});
  return scope.backend().transpose2d(x);
}

Tensor permute(const Tensor& x, const std::vector<int>& perm) {
  OpScope scope(Op::kPermute, {&x});
  return scope.backend().permute(x, perm);
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  OpScope scope(Op::kConcat, xs);
  return scope.backend().concat(xs, dim);
}

Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length) {
  OpScope scope(Op::kNarrowCopy, {&x});
  return scope.backend().narrow_copy(x, dim, start, length);
}

void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part) {
  OpScope scope(Op::kNarrowAdd, {&y, &part});
  scope.backend().narrow_add_(y, dim, start, part);
}

namespace {

// x (B, T, parts x heads x D): F32, or BF16 where bf16_ok (every backend's split reads these).
void check_packed_heads(const Tensor& x, std::int64_t parts, std::int64_t heads, const char* what,
                        bool bf16_ok = false) {
  const bool dtype_ok = x.dtype() == DType::F32 || (bf16_ok && x.dtype() == DType::BF16);
  if (x.dim() != 3 || !dtype_ok || heads <= 0 || x.size(2) % (parts * heads) != 0) {
    throw std::invalid_argument(
        std::string(what) + ": expected " + (bf16_ok ? "F32 or BF16" : "F32") + " (B, T, " +
        std::to_string(parts) + " x " + std::to_string(heads) + " heads x D), got " +
        dtype_name(x.dtype()) + " " + x.shape().str());
  }
}

}  // namespace

void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                     Tensor& v) {
  if (dtype != DType::F32 && dtype != DType::BF16) {
    throw std::invalid_argument(std::string("split_qkv_heads: F32 or BF16 heads, not ") +
                                dtype_name(dtype));
  }
  check_packed_heads(qkv, 3, heads, "split_qkv_heads", /*bf16_ok=*/dtype == DType::BF16);
  OpScope scope(Op::kSplitQkvHeads, {&qkv});
  scope.backend().split_qkv_heads(qkv, heads, dtype, q, k, v);
}

Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v) {
  OpScope scope(Op::kMergeQkvHeads, {&q, &k, &v});
  return scope.backend().merge_qkv_heads(q, k, v);
}

Tensor merge_qkv_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v) {
  OpScope scope(Op::kMergeQkvHeadsBf16, {&q, &k, &v});
  return scope.backend().merge_qkv_heads_bf16(q, k, v);
}

Tensor split_heads(const Tensor& x, std::int64_t heads) {
  check_packed_heads(x, 1, heads, "split_heads");
  OpScope scope(Op::kSplitHeads, {&x});
  return scope.backend().split_heads(x, heads);
}

Tensor merge_heads(const Tensor& y) {
  OpScope scope(Op::kMergeHeads, {&y});
  return scope.backend().merge_heads(y);
}

Tensor merge_heads_bf16(const Tensor& y, Tensor* y_bf16) {
  OpScope scope(Op::kMergeHeadsBf16, {&y});
  return scope.backend().merge_heads_bf16(y, y_bf16);
}

Tensor packed_attention_forward_bf16(const Tensor& qkv, std::int64_t heads, bool causal,
                                     float scale, Tensor& lse) {
  if (qkv.dtype() != DType::BF16) {
    throw std::invalid_argument(
        std::string("packed_attention_forward_bf16: expected a BF16 qkv, ") + "got " +
        dtype_name(qkv.dtype()));
  }
  check_packed_heads(qkv, 3, heads, "packed_attention_forward_bf16", /*bf16_ok=*/true);
  OpScope scope(Op::kPackedAttentionForwardBf16, {&qkv});
  return scope.backend().packed_attention_forward_bf16(qkv, heads, causal, scale, lse);
}

Tensor packed_attention_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, std::int64_t heads, bool causal, float scale,
                                 DType grad_dtype) {
  const char* what = "packed_attention_backward";
  if (qkv.dtype() != DType::BF16) {
    throw std::invalid_argument(std::string(what) + ": expected a BF16 qkv, got " +
                                dtype_name(qkv.dtype()));
  }
  check_packed_heads(qkv, 3, heads, what, /*bf16_ok=*/true);
  const Shape merged({qkv.size(0), qkv.size(1), qkv.size(2) / 3});
  const bool ok = (grad_out.dtype() == DType::F32 || grad_out.dtype() == DType::BF16) &&
                  grad_out.shape() == merged && out.dtype() == DType::BF16 &&
                  out.shape() == merged && lse.dtype() == DType::F32 &&
                  lse.numel() == qkv.size(0) * heads * qkv.size(1) &&
                  (grad_dtype == DType::F32 || grad_dtype == DType::BF16);
  if (!ok) {
    throw std::invalid_argument(
        std::string(what) + ": expected grad_out F32 or BF16 and out BF16 of " + merged.str() +
        ", lse F32 of " + std::to_string(qkv.size(0) * heads * qkv.size(1)) +
        " and an F32 or BF16 gradient; got " + dtype_name(grad_out.dtype()) + " " +
        grad_out.shape().str() + ", " + dtype_name(out.dtype()) + " " + out.shape().str() + ", " +
        dtype_name(lse.dtype()) + " " + lse.shape().str() + ", " + dtype_name(grad_dtype));
  }
  OpScope scope(Op::kPackedAttentionBackward, {&grad_out, &qkv, &out, &lse});
  return scope.backend().packed_attention_backward(grad_out, qkv, out, lse, heads, causal, scale,
                                                   grad_dtype);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  OpScope scope(Op::kWhere, {&cond, &a, &b});
  return scope.backend().where(cond, a, b);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  OpScope scope(Op::kMaskedFill, {&x, &mask});
  return scope.backend().masked_fill(x, mask, value);
}

Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices) {
  OpScope scope(Op::kIndexSelect0, {&x});
  return scope.backend().index_select0(x, indices);
}

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  OpScope scope(Op::kConv2dForward, {&x, &w, &bias});
  return scope.backend().conv2d_forward(x, w, bias, p);
}

void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Conv2dParams& p,
                     Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias) {
  OpScope scope(Op::kConv2dBackward, {&grad_y, &x, &w});
  scope.backend().conv2d_backward(grad_y, x, w, p, grad_x, grad_w, grad_bias);
}

Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax) {
  OpScope scope(Op::kMaxPool2dForward, {&x});
  return scope.backend().max_pool2d_forward(x, p, argmax);
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const Shape& x_shape) {
  OpScope scope(Op::kMaxPool2dBackward, {&grad_y, &argmax});
  return scope.backend().max_pool2d_backward(grad_y, argmax, x_shape);
}

Tensor conv2d_relu_max_pool2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                      const Conv2dParams& p, const Pool2dParams& pool,
                                      Tensor& argmax) {
  OpScope scope(Op::kConv2dReluMaxPool2dForward, {&x, &w, &bias});
  return scope.backend().conv2d_relu_max_pool2d_forward(x, w, bias, p, pool, argmax);
}

void conv2d_relu_max_pool2d_backward(const Tensor& grad_pooled, const Tensor& argmax,
                                     const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                     const Pool2dParams& pool, Tensor* grad_x, Tensor* grad_w,
                                     Tensor* grad_bias) {
  OpScope scope(Op::kConv2dReluMaxPool2dBackward, {&grad_pooled, &argmax, &x, &w});
  scope.backend().conv2d_relu_max_pool2d_backward(grad_pooled, argmax, x, w, p, pool, grad_x,
                                                  grad_w, grad_bias);
}

Tensor avg_pool2d_forward(const Tensor& x, const Pool2dParams& p) {
  OpScope scope(Op::kAvgPool2dForward, {&x});
  return scope.backend().avg_pool2d_forward(x, p);
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p) {
  OpScope scope(Op::kAvgPool2dBackward, {&grad_y});
  return scope.backend().avg_pool2d_backward(grad_y, x_shape, p);
}

Tensor batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                          Tensor& running_mean, Tensor& running_var, bool training, float momentum,
                          float eps, Tensor& save_mean, Tensor& save_invstd) {
  OpScope scope(Op::kBatchNormForward, {&x, &weight, &bias, &running_mean, &running_var});
  return scope.backend().batch_norm_forward(x, weight, bias, running_mean, running_var, training,
                                            momentum, eps, save_mean, save_invstd);
}

void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_invstd, bool training,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) {
  OpScope scope(Op::kBatchNormBackward, {&grad_y, &x, &weight});
  scope.backend().batch_norm_backward(grad_y, x, weight, save_mean, save_invstd, training, grad_x,
                                      grad_weight, grad_bias);
}

Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                          const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd) {
  OpScope scope(Op::kLayerNormForward, {&x, &weight, &bias});
  return scope.backend().layer_norm_forward(x, normalized, weight, bias, eps, save_mean, save_rstd);
}

Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                               const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd,
                               Tensor* x_bf16) {
  OpScope scope(Op::kLayerNormForwardBf16, {&x, &weight, &bias});
  return scope.backend().layer_norm_forward_bf16(x, normalized, weight, bias, eps, save_mean,
                                                 save_rstd, x_bf16);
}

Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                   const Tensor& weight, const Tensor& bias, float eps, Tensor& sum,
                                   Tensor& save_mean, Tensor& save_rstd, Tensor* sum_bf16) {
  OpScope scope(Op::kAddLayerNormForwardBf16, {&a, &b, &weight, &bias});
  if (a.dtype() != DType::F32 || b.dtype() != DType::F32 || a.shape() != b.shape()) {
    throw std::invalid_argument(
        "add_layer_norm_forward_bf16: expected two F32 tensors of one "
        "shape, got " +
        a.shape().str() + " " + dtype_name(a.dtype()) + " and " + b.shape().str() + " " +
        dtype_name(b.dtype()));
  }
  return scope.backend().add_layer_norm_forward_bf16(a, b, normalized, weight, bias, eps, sum,
                                                     save_mean, save_rstd, sum_bf16);
}

void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                         Tensor* grad_x_bf16) {
  if (grad_x_bf16 != nullptr && grad_x == nullptr) {
    throw std::invalid_argument("layer_norm backward: a bf16 copy of dx without dx");
  }
  const Tensor none;
  const Tensor& into = grad_x != nullptr ? *grad_x : none;  // defined: dx is added into it
  OpScope scope(Op::kLayerNormBackward, {&grad_y, &x, &weight, &into});
  if (into.defined()) {
    if (into.dtype() != DType::F32) {
      throw std::invalid_argument("layer_norm backward: the gradient added into is " +
                                  std::string(dtype_name(into.dtype())) + ", not F32");
    }
    check_shape(into, x.shape(), "layer_norm backward: the gradient added into");
  }
  scope.backend().layer_norm_backward(grad_y, x, normalized, weight, save_mean, save_rstd, grad_x,
                                      grad_weight, grad_bias, grad_x_bf16);
}

Tensor embedding_forward(const Tensor& table, const Tensor& indices) {
  OpScope scope(Op::kEmbeddingForward, {&table, &indices});
  return scope.backend().embedding_forward(table, indices);
}

void embedding_backward(const Tensor& grad_y, const Tensor& indices, Tensor& grad_table) {
  OpScope scope(Op::kEmbeddingBackward, {&grad_y, &indices, &grad_table});
  scope.backend().embedding_backward(grad_y, indices, grad_table);
}

void adam_step_(const AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v, Tensor& vmax) {
  OpScope scope(Op::kAdamStep, {&p, &g, &m, &v, &vmax});
  scope.backend().adam_step_(s, p, g, m, v, vmax);
}

void adam_step_multi_(const AdamStep& s, const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                      const std::vector<Tensor>& exp_avg_sq,
                      const std::vector<Tensor>& max_exp_avg_sq, const Tensor& grad_norm_sq,
                      float max_norm, const Tensor& halted) {
  const std::size_t n = params.size();
  if (grads.size() != n || exp_avg.size() != n || exp_avg_sq.size() != n ||
      (!max_exp_avg_sq.empty() && max_exp_avg_sq.size() != n)) {
    throw std::invalid_argument("adam_step_multi_: " + std::to_string(n) + " parameters but " +
                                std::to_string(grads.size()) + " gradients, " +
                                std::to_string(exp_avg.size()) + " and " +
                                std::to_string(exp_avg_sq.size()) + " moments, " +
                                std::to_string(max_exp_avg_sq.size()) + " maxima");
  }
  std::vector<Tensor> all;
  all.reserve(5 * n + 1);
  for (const auto* list : {&params, &grads, &exp_avg, &exp_avg_sq, &max_exp_avg_sq})
    all.insert(all.end(), list->begin(), list->end());
  if (grad_norm_sq.defined()) all.push_back(grad_norm_sq);
  if (halted.defined()) {
    if (halted.dtype() != DType::I32 || halted.numel() != 1) {
      throw std::invalid_argument("adam_step_multi_: halted must be one I32 value");
    }
    all.push_back(halted);
  }
  OpScope scope(Op::kAdamStepMulti, all);
  scope.backend().adam_step_multi_(s, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                   grad_norm_sq, max_norm, halted);
}

void halt_unless_finite_(Tensor& halted, const Tensor& value) {
  if (halted.numel() != 1 || halted.dtype() != DType::I32 || value.numel() != 1 ||
      value.dtype() != DType::F32) {
    throw std::invalid_argument(
        "halt_unless_finite_: expected a one-element I32 flag and a one-element F32 value, got " +
        halted.shape().str() + " " + dtype_name(halted.dtype()) + " and " + value.shape().str() +
        " " + dtype_name(value.dtype()));
  }
  OpScope scope(Op::kHaltUnlessFinite, {&halted, &value});
  scope.backend().halt_unless_finite_(halted, value);
}

void sgd_step_(const SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf) {
  OpScope scope(Op::kSgdStep, {&p, &g, &buf});
  scope.backend().sgd_step_(s, p, g, buf);
}

Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& labels) {
  OpScope scope(Op::kNllLossForward, {&log_probs, &labels});
  return scope.backend().nll_loss_forward(log_probs, labels);
}

Tensor nll_loss_backward(const Tensor& grad, const Tensor& labels, const Shape& shape) {
  OpScope scope(Op::kNllLossBackward, {&grad, &labels});
  return scope.backend().nll_loss_backward(grad, labels, shape);
}

Tensor kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs) {
  OpScope scope(Op::kKlDivForward, {&input_log_probs, &target_probs});
  return scope.backend().kl_div_forward(input_log_probs, target_probs);
}

void kl_div_backward(const Tensor& grad, const Tensor& input_log_probs, const Tensor& target_probs,
                     Tensor* grad_input, Tensor* grad_target) {
  OpScope scope(Op::kKlDivBackward, {&grad, &input_log_probs, &target_probs});
  scope.backend().kl_div_backward(grad, input_log_probs, target_probs, grad_input, grad_target);
}

void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x) {
  OpScope scope(Op::kChannelMoments, {&sum, &sum_squares, &x});
  scope.backend().channel_moments_(sum, sum_squares, x);
}

void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                           const Tensor& sum_squares, std::int64_t count, float momentum) {
  OpScope scope(Op::kRunningStatsUpdate, {&running_mean, &running_var, &sum, &sum_squares});
  scope.backend().running_stats_update_(running_mean, running_var, sum, sum_squares, count,
                                        momentum);
}

Tensor squared_norm(const std::vector<Tensor>& xs) {
  OpScope scope(Op::kSquaredNorm, xs);
  return scope.backend().squared_norm(xs);
}

Tensor dropout_mask(const Shape& shape, float p, Generator& gen) {
  OpScope scope(Op::kDropoutMask, {});
  return scope.backend().dropout_mask(shape, p, gen);
}

}  // namespace kernels
}  // namespace hpm
