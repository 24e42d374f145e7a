#include "hpm/nn/layers.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

#include "hpm/nn/recompute.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/placement.h"

namespace hpm::nn {

namespace {
// PyTorch's kaiming_uniform_(a=sqrt(5)) and bias init both reduce to U(-1/sqrt(fan_in), ..).
Tensor fan_in_uniform(const Shape& shape, std::int64_t fan_in, Generator& gen) {
  const float bound = fan_in > 0 ? 1.0f / std::sqrt(static_cast<float>(fan_in)) : 0.0f;
  return Tensor::uniform(shape, gen, -bound, bound);
}
std::string b(bool v) { return v ? "True" : "False"; }
}  // namespace

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool has_bias, Generator& gen)
    : in_(in_features), out_(out_features) {
  if (in_features <= 0 || out_features <= 0) {
    throw std::invalid_argument("Linear: features must be positive, got " +
                                std::to_string(in_features) + " -> " +
                                std::to_string(out_features));
  }
  weight = register_parameter("weight", fan_in_uniform({out_, in_}, in_, gen));
  if (has_bias) bias = register_parameter("bias", fan_in_uniform({out_}, in_, gen));
}

namespace {

// A Linear's product over the rows of x (N, IN) or (..., IN): one GEMM over all the leading
// dimensions' rows.
template <typename Product>
Tensor over_rows(const Tensor& x, std::int64_t in, std::int64_t out, Product&& product) {
  if (x.dim() < 2 || x.size(-1) != in) {
    throw std::invalid_argument("Linear(" + std::to_string(in) + ", " + std::to_string(out) +
                                "): expected input (N, " + std::to_string(in) + ") or (..., " +
                                std::to_string(in) + "), got " + x.shape().str());
  }
  if (x.dim() == 2) return product(x);
  std::vector<std::int64_t> dims = x.shape().dims();
  dims.back() = out;
  return reshape(product(reshape(x, {x.numel() / in, in})), Shape(dims));
}

}  // namespace

Tensor Linear::forward(const Tensor& x) {
  return over_rows(x, in_, out_, [this](const Tensor& rows) { return linear(rows, weight, bias); });
}

Tensor Linear::forward_after_gelu(const Tensor& x, const Tensor& residual) {
  if (residual.defined()) {
    // The residual must have the output's shape (not only its size: its rows are the output's).
    std::vector<std::int64_t> dims = x.shape().dims();
    if (!dims.empty()) dims.back() = out_;
    if (x.dim() < 2 || x.size(-1) != in_ || residual.shape() != Shape(dims))
      return add(residual, forward_after_gelu(x));  // which reports a wrong x or shape
  }
  return over_rows(x, in_, out_, [&](const Tensor& rows) {
    return gelu_linear(rows, weight, bias,
                       residual.defined() ? reshape(residual, {rows.size(0), out_}) : Tensor());
  });
}

Tensor Linear::forward_after_attention(const Tensor& qkv, std::int64_t heads) {
  if (qkv.dim() != 3 || qkv.size(2) != 3 * in_) {
    throw std::invalid_argument("Linear(" + std::to_string(in_) + ", " + std::to_string(out_) +
                                ") after attention: expected packed q|k|v (B, T, " +
                                std::to_string(3 * in_) + "), got " + qkv.shape().str());
  }
  return packed_self_attention_linear(qkv, heads, /*causal=*/true, weight, bias);
}

Tensor Linear::forward_after(LayerNorm& ln, const Tensor& x, DType out) {
  if (ln.normalized_shape() != Shape{in_}) return forward(ln.forward(x));
  return over_rows(x, in_, out_, [this, &ln, out](const Tensor& rows) {
    return layer_norm_linear(rows, ln.weight, ln.bias, ln.eps(), weight, bias, out);
  });
}

Tensor Linear::forward_after_sum(LayerNorm& ln, const Tensor& a, const Tensor& b, Tensor& sum,
                                 DType out) {
  if (ln.normalized_shape() != Shape{in_} || a.shape() != b.shape()) {
    sum = add(a, b);
    return forward_after(ln, sum, out);
  }
  Tensor sum_rows;
  Tensor y = over_rows(a, in_, out_, [&](const Tensor& rows) {
    return residual_layer_norm_linear(rows, reshape(b, rows.shape()), sum_rows, ln.weight, ln.bias,
                                      ln.eps(), weight, bias, out);
  });
  sum = reshape(sum_rows, a.shape());
  return y;
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_) + ", out_features=" + std::to_string(out_) +
         ", bias=" + b(bias.defined());
}

Conv2d::Conv2d(const Conv2dOptions& o, Generator& gen) : o_(o) {
  if (o.in_channels <= 0 || o.out_channels <= 0 || o.kernel_size <= 0 || o.stride <= 0 ||
      o.padding < 0) {
    throw std::invalid_argument("Conv2d: invalid options");
  }
  const std::int64_t fan_in = o.in_channels * o.kernel_size * o.kernel_size;
  weight = register_parameter(
      "weight",
      fan_in_uniform({o.out_channels, o.in_channels, o.kernel_size, o.kernel_size}, fan_in, gen));
  if (o.bias) bias = register_parameter("bias", fan_in_uniform({o.out_channels}, fan_in, gen));
}

Tensor Conv2d::forward(const Tensor& x) {
  if (x.dim() != 4 || x.size(1) != o_.in_channels) {
    throw std::invalid_argument("Conv2d: expected input (N, " + std::to_string(o_.in_channels) +
                                ", H, W), got " + x.shape().str());
  }
  kernels::Conv2dParams p{o_.stride, o_.stride, o_.padding, o_.padding};
  return conv2d(x, weight, bias, p);
}

Tensor Conv2d::forward_relu(const Tensor& x) {
  if (x.dim() != 4 || x.size(1) != o_.in_channels) return relu(forward(x));  // forward reports it
  kernels::Conv2dParams p{o_.stride, o_.stride, o_.padding, o_.padding, true};
  return conv2d(x, weight, bias, p);
}

Tensor Conv2d::forward_relu_max_pool(const Tensor& x, const kernels::Pool2dParams& pool) {
  if (x.dim() != 4 || x.size(1) != o_.in_channels) return max_pool2d(forward_relu(x), pool);
  kernels::Conv2dParams p{o_.stride, o_.stride, o_.padding, o_.padding, true};
  return conv2d_relu_max_pool2d(x, weight, bias, p, pool);
}

std::string Conv2d::extra_repr() const {
  std::ostringstream os;
  os << o_.in_channels << ", " << o_.out_channels << ", kernel_size=" << o_.kernel_size
     << ", stride=" << o_.stride << ", padding=" << o_.padding << ", bias=" << b(o_.bias);
  return os.str();
}

namespace {
kernels::Pool2dParams pool_params(int k, int s, int p, bool include_pad) {
  if (k <= 0 || s < 0 || p < 0)
    throw std::invalid_argument("pooling: invalid kernel/stride/padding");
  const int stride = s == 0 ? k : s;
  return {k, k, stride, stride, p, p, include_pad};
}
std::string pool_repr(const kernels::Pool2dParams& p) {
  return "kernel_size=" + std::to_string(p.kernel_h) + ", stride=" + std::to_string(p.stride_h) +
         ", padding=" + std::to_string(p.pad_h);
}
}  // namespace

MaxPool2d::MaxPool2d(int kernel_size, int stride, int padding)
    : p_(pool_params(kernel_size, stride, padding, true)) {}
std::string MaxPool2d::extra_repr() const { return pool_repr(p_); }

AvgPool2d::AvgPool2d(int kernel_size, int stride, int padding, bool count_include_pad)
    : p_(pool_params(kernel_size, stride, padding, count_include_pad)) {}
std::string AvgPool2d::extra_repr() const { return pool_repr(p_); }

Dropout::Dropout(float p, Generator* gen) : p_(p), gen_(gen) {
  if (p < 0.0f || p >= 1.0f) {
    throw std::invalid_argument("Dropout: p must be in [0, 1), got " + std::to_string(p));
  }
}
std::string Dropout::extra_repr() const { return "p=" + std::to_string(p_); }

BatchNorm::BatchNorm(const BatchNormOptions& o, int spatial_dims)
    : o_(o), spatial_dims_(spatial_dims) {
  if (o.num_features <= 0) throw std::invalid_argument("BatchNorm: num_features must be positive");
  if (o.affine) {
    weight = register_parameter("weight", Tensor::ones({o.num_features}));
    bias = register_parameter("bias", Tensor::zeros({o.num_features}));
  }
  if (o.track_running_stats) {
    running_mean = register_buffer("running_mean", Tensor::zeros({o.num_features}));
    running_var = register_buffer("running_var", Tensor::ones({o.num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::I64));
  }
}

Tensor BatchNorm::forward(const Tensor& x) {
  const bool ok = spatial_dims_ == 2 ? x.dim() == 4 : (x.dim() == 2 || x.dim() == 3);
  if (!ok || x.size(1) != o_.num_features) {
    throw std::invalid_argument(type_name() + "(" + std::to_string(o_.num_features) +
                                "): unexpected input shape " + x.shape().str());
  }
  const bool use_batch_stats = is_training() || !o_.track_running_stats;
  // A recomputation re-runs a forward that already updated the running statistics once.
  if (is_training() && recomputing()) {
    return batch_norm(x, weight, bias, Tensor(), Tensor(), use_batch_stats, o_.momentum, o_.eps);
  }
  if (deferred_ && is_training() && o_.track_running_stats) {
    kernels::channel_moments_(sum_, sum_squares_, x);
    count_ += x.numel() / o_.num_features;
    return batch_norm(x, weight, bias, Tensor(), Tensor(), true, o_.momentum, o_.eps);
  }
  if (is_training() && o_.track_running_stats) count_batch();
  return batch_norm(x, weight, bias, running_mean, running_var, use_batch_stats, o_.momentum,
                    o_.eps);
}

void BatchNorm::count_batch() {
  num_batches_tracked.copy_(kernels::add_scalar(num_batches_tracked, 1.0f));
}

void BatchNorm::defer_running_stats(bool on) {
  deferred_ = on;
  Device& device = running_mean.defined() ? device_beside(running_mean) : Device::current();
  sum_ = Tensor::zeros({o_.num_features}, DType::F64, device);
  sum_squares_ = Tensor::zeros({o_.num_features}, DType::F64, device);
  count_ = 0;
}

void BatchNorm::commit_deferred() {
  if (!deferred_ || count_ == 0 || !o_.track_running_stats) return;
  kernels::running_stats_update_(running_mean, running_var, sum_, sum_squares_, count_,
                                 o_.momentum);
  count_batch();
  defer_running_stats(true);
}

std::string BatchNorm::extra_repr() const {
  std::ostringstream os;
  os << o_.num_features << ", eps=" << o_.eps << ", momentum=" << o_.momentum
     << ", affine=" << b(o_.affine) << ", track_running_stats=" << b(o_.track_running_stats);
  return os.str();
}

LayerNorm::LayerNorm(Shape normalized_shape, float eps, bool elementwise_affine)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  if (elementwise_affine) {
    weight = register_parameter("weight", Tensor::ones(shape_));
    bias = register_parameter("bias", Tensor::zeros(shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const int k = shape_.rank();
  bool ok = x.dim() >= k;
  for (int i = 0; ok && i < k; ++i) ok = x.size(x.dim() - k + i) == shape_[i];
  if (!ok) {
    throw std::invalid_argument("LayerNorm(" + shape_.str() + "): input " + x.shape().str() +
                                " does not end with the normalized shape");
  }
  return layer_norm(x, shape_.numel(), weight, bias, eps_);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << shape_.str() << ", eps=" << eps_ << ", elementwise_affine=" << b(weight.defined());
  return os.str();
}

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t dim, Generator& gen) {
  if (num_embeddings <= 0 || dim <= 0)
    throw std::invalid_argument("Embedding: sizes must be positive");
  weight = register_parameter("weight", Tensor::randn({num_embeddings, dim}, gen));
}

std::string Embedding::extra_repr() const {
  return std::to_string(weight.size(0)) + ", " + std::to_string(weight.size(1));
}

}  // namespace hpm::nn
