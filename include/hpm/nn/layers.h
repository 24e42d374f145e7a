// The standard layers, with PyTorch's default initializations so that models match torch.nn
// layer for layer (weights drawn from hpm's Generator, not torch's, so values differ; the
// distributions do not).
#pragma once
#include <cstdint>

#include "hpm/nn/module.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {

class LayerNorm;

// y = x W^T + b. W (out, in) and b (out) ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform, a=sqrt(5)).
class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true,
         Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  // forward(gelu(x)), the GELU fused into the product's operand (autograd's gelu_linear).
  // With `residual` (the output's shape), residual + forward(gelu(x)), the sum made by the product.
  Tensor forward_after_gelu(const Tensor& x, const Tensor& residual = Tensor());
  // forward(ln.forward(x)), the norm fused likewise (layer_norm_linear) when it normalizes the
  // last dimension alone; out BF16: under bf16 autocast's fusions the output rounded to bf16 as
  // the product writes it, for a fused op that reads it so (forward_after_gelu,
  // forward_after_attention).
  Tensor forward_after(LayerNorm& ln, const Tensor& x, DType out = DType::F32);
  // A residual stream's step: sum = a + b (one shape) and forward_after(ln, sum), the sum written
  // by the norm's pass (autograd's residual_layer_norm_linear). out BF16: under bf16 autocast's
  // fusions the output rounded to bf16 as forward_after's.
  Tensor forward_after_sum(LayerNorm& ln, const Tensor& a, const Tensor& b, Tensor& sum,
                           DType out = DType::F32);
  // forward(packed_self_attention(qkv, heads)), causal, qkv (B, T, 3 x in): the attention's merged
  // heads written as the product's operand (packed_self_attention_linear).
  Tensor forward_after_attention(const Tensor& qkv, std::int64_t heads);
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;
  Tensor weight, bias;

 private:
  std::int64_t in_, out_;
};

struct Conv2dOptions {
  std::int64_t in_channels = 1, out_channels = 1;
  int kernel_size = 3, stride = 1, padding = 0;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& o, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) in one pass: the fusion pass (fusion.h) runs a Conv2d followed by a ReLU so.
  Tensor forward_relu(const Tensor& x);
  // max_pool2d(relu(forward(x))) in one op: likewise for a Conv2d, a ReLU and a MaxPool2d.
  Tensor forward_relu_max_pool(const Tensor& x, const kernels::Pool2dParams& pool);
  std::string type_name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  Tensor weight, bias;

 private:
  Conv2dOptions o_;
};

class MaxPool2d : public Module {
 public:
  // stride 0 means stride = kernel_size, as in PyTorch.
  explicit MaxPool2d(int kernel_size, int stride = 0, int padding = 0);
  Tensor forward(const Tensor& x) override { return max_pool2d(x, p_); }
  const kernels::Pool2dParams& params() const { return p_; }
  std::string type_name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override;

 private:
  kernels::Pool2dParams p_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int kernel_size, int stride = 0, int padding = 0,
                     bool count_include_pad = true);
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, p_); }
  std::string type_name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override;

 private:
  kernels::Pool2dParams p_;
};

// (N,C,H,W) -> (N,C): AdaptiveAvgPool2d(1) followed by Flatten.
class GlobalAvgPool2d : public Module {
 public:
  Tensor forward(const Tensor& x) override { return global_avg_pool2d(x); }
  std::string type_name() const override { return "GlobalAvgPool2d"; }
};

class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override { return flatten(x, 1); }
  std::string type_name() const override { return "Flatten"; }
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string type_name() const override { return "ReLU"; }
};

class GELU : public Module {
 public:
  explicit GELU(bool tanh_approximation = false) : tanh_(tanh_approximation) {}
  Tensor forward(const Tensor& x) override { return gelu(x, tanh_); }
  std::string type_name() const override { return "GELU"; }

 private:
  bool tanh_;
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return tanh(x); }
  std::string type_name() const override { return "Tanh"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
  std::string type_name() const override { return "Sigmoid"; }
};

class Dropout : public Module {
 public:
  // Without `gen`, each forward draws from the calling thread's default generator (so replicas
  // on threads of their own draw from their own streams).
  explicit Dropout(float p = 0.5f, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override {
    return dropout(x, p_, is_training(), gen_ != nullptr ? *gen_ : default_generator());
  }
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override;
  float p() const { return p_; }

 private:
  float p_;
  Generator* gen_;
};

struct BatchNormOptions {
  std::int64_t num_features = 0;
  float eps = 1e-5f, momentum = 0.1f;
  bool affine = true, track_running_stats = true;
};

// BatchNorm1d takes (N,C) or (N,C,L); BatchNorm2d (N,C,H,W). Same arithmetic over (N, spatial).
class BatchNorm : public Module {
 public:
  BatchNorm(const BatchNormOptions& o, int spatial_dims);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override {
    return spatial_dims_ == 2 ? "BatchNorm2d" : "BatchNorm1d";
  }
  std::string extra_repr() const override;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

  // Pipeline micro-batches (torchgpipe's DeferredBatchNorm): while deferred, a training forward
  // normalizes by its own micro-batch's statistics but leaves the running statistics alone,
  // adding to per-channel sums instead; commit_deferred() then updates them once, as one forward
  // over the whole mini-batch would have.
  void defer_running_stats(bool on);
  void commit_deferred();

 private:
  BatchNormOptions o_;
  int spatial_dims_;
  bool deferred_ = false;
  // num_batches_tracked += 1.
  void count_batch();
  Tensor sum_, sum_squares_;  // F64 per channel, on the running statistics' device
  std::int64_t count_ = 0;
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(const BatchNormOptions& o) : BatchNorm(o, 1) {}
};
class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(const BatchNormOptions& o) : BatchNorm(o, 2) {}
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, float eps = 1e-5f, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;
  const Shape& normalized_shape() const { return shape_; }
  float eps() const { return eps_; }
  Tensor weight, bias;

 private:
  Shape shape_;
  float eps_;
};

// Lookup table (num_embeddings, dim) ~ N(0, 1); input I64 indices.
class Embedding : public Module {
 public:
  Embedding(std::int64_t num_embeddings, std::int64_t dim, Generator& gen = default_generator());
  Tensor forward(const Tensor& indices) override { return embedding(weight, indices); }
  std::string type_name() const override { return "Embedding"; }
  std::string extra_repr() const override;
  Tensor weight;
};

}  // namespace hpm::nn
