// Every differentiable op: forward through a kernel, then its gradient rule. Rules save inputs as
// they are and outputs detached (an output saving itself would be a reference cycle).
#include "hpm/autograd/ops.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include "hpm/autograd/autocast.h"
#include "hpm/autograd/deferred.h"
#include "hpm/autograd/node.h"

namespace hpm {

using autograd::accumulate_into;
using autograd::autocast_precision;
using autograd::Precision;
using autograd::record;
using autograd::Tensors;
using kernels::BinaryOp;
using kernels::UnaryOp;
using Needs = std::vector<bool>;

// ---- arithmetic ------------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::binary(BinaryOp::Add, a, b);
  const Shape sa = a.shape(), sb = b.shape();
  return record("Add", {a, b}, y, [sa, sb](const Tensor& g, const Needs& n) {
    return Tensors{n[0] ? kernels::sum_to(g, sa) : Tensor(),
                   n[1] ? kernels::sum_to(g, sb) : Tensor()};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::binary(BinaryOp::Sub, a, b);
  const Shape sa = a.shape(), sb = b.shape();
  return record("Sub", {a, b}, y, [sa, sb](const Tensor& g, const Needs& n) {
    return Tensors{n[0] ? kernels::sum_to(g, sa) : Tensor(),
                   n[1] ? kernels::sum_to(kernels::mul_scalar(g, -1.0f), sb) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::binary(BinaryOp::Mul, a, b);
  return record("Mul", {a, b}, y, [a, b](const Tensor& g, const Needs& n) {
    return Tensors{
        n[0] ? kernels::sum_to(kernels::binary(BinaryOp::Mul, g, b), a.shape()) : Tensor(),
        n[1] ? kernels::sum_to(kernels::binary(BinaryOp::Mul, g, a), b.shape()) : Tensor()};
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = kernels::binary(BinaryOp::Div, a, b);
  Tensor yd = y.detach();
  return record("Div", {a, b}, y, [a, b, yd](const Tensor& g, const Needs& n) {
    Tensor ga, gb;
    if (n[0]) ga = kernels::sum_to(kernels::binary(BinaryOp::Div, g, b), a.shape());
    if (n[1]) {
      // d(a/b)/db = -y / b
      Tensor t = kernels::binary(BinaryOp::Div, kernels::binary(BinaryOp::Mul, g, yd), b);
      gb = kernels::sum_to(kernels::mul_scalar(t, -1.0f), b.shape());
    }
    return Tensors{ga, gb};
  });
}

Tensor add(const Tensor& a, float s) {
  return record("AddScalar", {a}, kernels::add_scalar(a, s),
                [](const Tensor& g, const Needs&) { return Tensors{g}; });
}

Tensor mul(const Tensor& a, float s) {
  return record("MulScalar", {a}, kernels::mul_scalar(a, s),
                [s](const Tensor& g, const Needs&) { return Tensors{kernels::mul_scalar(g, s)}; });
}

// ---- element-wise functions ------------------------------------------------------------------

namespace {
// An activation kept for backward, as autocast.h's rule says: under bf16 a bf16 copy (half the
// bytes), widened back to f32 when backward needs it; otherwise the tensor itself.
class SavedActivation {
 public:
  explicit SavedActivation(const Tensor& x)
      : rounded_(autocast_precision() == Precision::BF16 && x.dtype() == DType::F32),
        t_(rounded_ ? kernels::to_bf16(x) : x) {}
  Tensor get() const { return rounded_ ? kernels::to_f32(t_) : t_; }

 private:
  bool rounded_;
  Tensor t_;
};

Tensor unary_op(const char* name, UnaryOp op, const Tensor& x) {
  Tensor y = kernels::unary(op, x);
  if (op == UnaryOp::Gelu) {
    // Its backward needs the input alone: the output (as wide as the input) is not kept.
    return record(name, {x}, y, [op, xs = SavedActivation(x)](const Tensor& g, const Needs&) {
      return Tensors{kernels::unary_backward(op, g, xs.get(), Tensor())};
    });
  }
  Tensor yd = y.detach();
  return record(name, {x}, y, [op, x, yd](const Tensor& g, const Needs&) {
    return Tensors{kernels::unary_backward(op, g, x, yd)};
  });
}
}  // namespace

Tensor neg(const Tensor& a) { return unary_op("Neg", UnaryOp::Neg, a); }
Tensor exp(const Tensor& x) { return unary_op("Exp", UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_op("Log", UnaryOp::Log, x); }
Tensor sqrt(const Tensor& x) { return unary_op("Sqrt", UnaryOp::Sqrt, x); }
Tensor square(const Tensor& x) { return unary_op("Square", UnaryOp::Square, x); }
Tensor relu(const Tensor& x) { return unary_op("Relu", UnaryOp::Relu, x); }
Tensor tanh(const Tensor& x) { return unary_op("Tanh", UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary_op("Sigmoid", UnaryOp::Sigmoid, x); }
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return unary_op("Gelu", tanh_approximation ? UnaryOp::GeluTanh : UnaryOp::Gelu, x);
}

// ---- reductions ----------------------------------------------------------------------------

Tensor sum(const Tensor& x) {
  const Shape s = x.shape();
  return record("Sum", {x}, kernels::sum_all(x), [s](const Tensor& g, const Needs&) {
    return Tensors{kernels::broadcast_to(g, s)};
  });
}

Tensor sum(const Tensor& x, int dim, bool keepdim) {
  const Shape s = x.shape();
  const int d = s.wrap(dim);
  return record("SumDim", {x}, kernels::sum_dim(x, d, keepdim),
                [s, d, keepdim](const Tensor& g, const Needs&) {
                  Shape kept = s;
                  kept[d] = 1;
                  Tensor gk = keepdim ? g : g.reshape(kept);
                  return Tensors{kernels::broadcast_to(gk, s)};
                });
}

Tensor mean(const Tensor& x) { return mul(sum(x), 1.0f / static_cast<float>(x.numel())); }

Tensor mean(const Tensor& x, int dim, bool keepdim) {
  return mul(sum(x, dim, keepdim), 1.0f / static_cast<float>(x.size(dim)));
}

// ---- shape -----------------------------------------------------------------------------------

Tensor reshape(const Tensor& x, const Shape& shape) {
  const Shape s = x.shape();
  return record("Reshape", {x}, x.reshape(shape),
                [s](const Tensor& g, const Needs&) { return Tensors{g.reshape(s)}; });
}

Tensor flatten(const Tensor& x, int start_dim) {
  const int d = x.shape().wrap(start_dim);
  std::vector<std::int64_t> dims(x.shape().dims().begin(), x.shape().dims().begin() + d);
  dims.push_back(x.shape().numel_from(d));
  return reshape(x, Shape(dims));
}

Tensor transpose(const Tensor& x) {
  return record("Transpose", {x}, kernels::transpose2d(x),
                [](const Tensor& g, const Needs&) { return Tensors{kernels::transpose2d(g)}; });
}

Tensor transpose(const Tensor& x, int dim0, int dim1) {
  std::vector<int> perm(static_cast<std::size_t>(x.dim()));
  for (int i = 0; i < x.dim(); ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(x.shape().wrap(dim0))],
            perm[static_cast<std::size_t>(x.shape().wrap(dim1))]);
  return permute(x, perm);
}

Tensor permute(const Tensor& x, const std::vector<int>& perm) {
  std::vector<int> inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    inverse[static_cast<std::size_t>(x.shape().wrap(perm[i]))] = static_cast<int>(i);
  return record(
      "Permute", {x}, kernels::permute(x, perm),
      [inverse](const Tensor& g, const Needs&) { return Tensors{kernels::permute(g, inverse)}; });
}

Tensor narrow(const Tensor& x, int dim, std::int64_t start, std::int64_t length) {
  const Shape s = x.shape();
  const int d = s.wrap(dim);
  return record("Narrow", {x}, kernels::narrow_copy(x, d, start, length),
                [s, d, start](const Tensor& g, const Needs&) {
                  Tensor gx = Tensor::zeros(s, DType::F32, g.device());
                  kernels::narrow_add_(gx, d, start, g);
                  return Tensors{gx};
                });
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  if (xs.empty()) throw std::invalid_argument("concat: no tensors");
  const int d = xs[0].shape().wrap(dim);
  std::vector<std::int64_t> sizes;
  for (const Tensor& x : xs) sizes.push_back(x.size(d));
  return record("Concat", xs, kernels::concat(xs, d), [sizes, d](const Tensor& g, const Needs& n) {
    Tensors gs(sizes.size());
    std::int64_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); at += sizes[i], ++i)
      if (n[i]) gs[i] = kernels::narrow_copy(g, d, at, sizes[i]);
    return gs;
  });
}

std::vector<Tensor> split(const Tensor& x, std::int64_t size, int dim) {
  if (size <= 0)
    throw std::invalid_argument("split: size must be positive, got " + std::to_string(size));
  const int d = x.shape().wrap(dim);
  std::vector<Tensor> parts;
  for (std::int64_t at = 0; at < x.size(d); at += size)
    parts.push_back(narrow(x, d, at, std::min(size, x.size(d) - at)));
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, std::int64_t chunks, int dim) {
  if (chunks <= 0) {
    throw std::invalid_argument("chunk: chunks must be positive, got " + std::to_string(chunks));
  }
  const std::int64_t extent = x.size(x.shape().wrap(dim));
  return split(x, std::max<std::int64_t>(1, (extent + chunks - 1) / chunks), dim);
}

// ---- selection -------------------------------------------------------------------------------

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape sa = a.shape(), sb = b.shape();
  return record(
      "Where", {a, b}, kernels::where(cond, a, b), [cond, sa, sb](const Tensor& g, const Needs& n) {
        const Tensor zero = Tensor::zeros({}, DType::F32, g.device());
        return Tensors{n[0] ? kernels::sum_to(kernels::where(cond, g, zero), sa) : Tensor(),
                       n[1] ? kernels::sum_to(kernels::where(cond, zero, g), sb) : Tensor()};
      });
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  return record("MaskedFill", {x}, kernels::masked_fill(x, mask, value),
                [mask](const Tensor& g, const Needs&) {
                  return Tensors{kernels::masked_fill(g, mask, 0.0f)};
                });
}

// ---- linear algebra --------------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2) {
    const Shape sa = a.shape(), sb = b.shape();
    return record("BatchedMatMul", {a, b}, kernels::bmm(a, b),
                  [a, b, sa, sb](const Tensor& g, const Needs& n) {
                    // dA = G B^T, dB = A^T G, each summed over the batch dimensions it was
                    // broadcast along.
                    return Tensors{
                        n[0] ? kernels::sum_to(kernels::bmm(g, b, false, true), sa) : Tensor(),
                        n[1] ? kernels::sum_to(kernels::bmm(a, g, true, false), sb) : Tensor()};
                  });
  }
  if (autocast_precision() == Precision::BF16) {
    // Operands kept in bf16 for backward: dA = G B^T, dB = A^T G with G rounded to bf16.
    const Tensor ab = kernels::to_bf16(a), bb = kernels::to_bf16(b);
    return record("MatMulBF16", {a, b}, kernels::matmul(ab, bb),
                  [ab, bb](const Tensor& g, const Needs& n) {
                    const Tensor gb = kernels::to_bf16(g);
                    return Tensors{n[0] ? kernels::matmul(gb, bb, false, true) : Tensor(),
                                   n[1] ? kernels::matmul(ab, gb, true, false) : Tensor()};
                  });
  }
  return record("MatMul", {a, b}, kernels::matmul(a, b), [a, b](const Tensor& g, const Needs& n) {
    // dA = G B^T, dB = A^T G
    return Tensors{n[0] ? kernels::matmul(g, b, false, true) : Tensor(),
                   n[1] ? kernels::matmul(a, g, true, false) : Tensor()};
  });
}

namespace {

// dW = g^T x for a Linear, added by the GEMM itself into W's gradient when that is the same thing
// (see accumulate_into); otherwise returned for the caller to accumulate.
Tensor linear_weight_gradient(const Tensor& g, const Tensor& x, const Tensor& weight) {
  Tensor acc = accumulate_into(weight);
  if (acc.defined() && acc.shape() == weight.shape()) {
    kernels::matmul_add_(acc, g, x, true, false);
    return Tensor();
  }
  return kernels::matmul(g, x, true, false);
}

// What the engine would do with a gradient for `leaf`: its accumulator adds it (hooks included).
void add_to_leaf(const Tensor& leaf, const Tensor& grad) {
  if (!grad.defined()) return;
  autograd::gradient_edge(leaf).fn->apply(Tensors{grad});
}

// The same in bf16: g and x already rounded, the sum in f32.
Tensor linear_weight_gradient_bf16(const Tensor& gb, const Tensor& xb, const Tensor& weight) {
  Tensor acc = accumulate_into(weight);
  if (acc.defined() && acc.shape() == weight.shape()) {
    kernels::matmul_add_(acc, gb, xb, true, false);
    return Tensor();
  }
  return kernels::matmul(gb, xb, true, false);
}

// What a Linear's backward does after dx: dW (by `weight_gradient`) and db now, or, in a
// zero-bubble pipeline's B pass, queued for its W pass. Shared by the f32 and bf16 Linears.
Tensors linear_gradients(const Tensor& g, const Needs& n, Tensor gx, const Tensor& weight,
                         const Tensor& bias, std::function<Tensor()> weight_gradient) {
  autograd::DeferredWeightGradients* later = autograd::deferred_weight_gradients();
  if (later != nullptr && (n[1] || n[2]) && (!n[1] || weight.is_leaf()) &&
      (!n[2] || bias.is_leaf())) {
    later->push(
        [g, weight, bias, weight_gradient = std::move(weight_gradient), nw = n[1], nb = n[2]] {
          if (nw) add_to_leaf(weight, weight_gradient());
          if (nb) add_to_leaf(bias, kernels::sum_dim(g, 0, false));
        });
    return Tensors{std::move(gx), Tensor(), Tensor()};
  }
  return Tensors{std::move(gx), n[1] ? weight_gradient() : Tensor(),
                 n[2] ? kernels::sum_dim(g, 0, false) : Tensor()};
}

// A Linear under bf16 autocast (autocast.h): x and W rounded to bf16 for the product, x kept so
// for backward, which rounds g too and W again (a weight is not an activation: rounding it twice
// costs less than keeping a copy per use); bias, outputs and gradients f32.
Tensor linear_bf16(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor xb = kernels::to_bf16(x);
  Tensor y = kernels::linear(xb, kernels::to_bf16(weight), bias);
  return record(
      "LinearBF16", {x, weight, bias}, y, [xb, weight, bias](const Tensor& g, const Needs& n) {
        const Tensor gb = kernels::to_bf16(g);
        return linear_gradients(
            g, n, n[0] ? kernels::matmul(gb, kernels::to_bf16(weight)) : Tensor(), weight, bias,
            [gb, xb, weight] { return linear_weight_gradient_bf16(gb, xb, weight); });
      });
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (autocast_precision() == Precision::BF16) return linear_bf16(x, weight, bias);
  Tensor y = kernels::linear(x, weight, bias);
  return record("Linear", {x, weight, bias}, y, [x, weight, bias](const Tensor& g, const Needs& n) {
    // g(N,OUT): dx = g W (N,IN), dW = g^T x (OUT,IN), db = sum_rows g (OUT)
    return linear_gradients(g, n, n[0] ? kernels::matmul(g, weight) : Tensor(), weight, bias,
                            [g, x, weight] { return linear_weight_gradient(g, x, weight); });
  });
}

// ---- convolution and pooling ---------------------------------------------------------------

// autocast.h's rule for convolutions: bf16 only where each output sums at least 32 products
// (C_in x KH x KW). Below that (a first layer over one image channel: 9) vdpbf16ps has almost
// nothing to pair, and the bf16 conversion of the output gradient, on oneDNN's slower generic
// reorder, costs more than the convolution saves (cnn: conv1 65 + 62 ms either way per 200
// steps, its gradient's reorder 150 ms in bf16 against 77 in f32; ONEDNN_VERBOSE).
namespace {
bool bf16_pays_for_convolution(const Tensor& weight) {
  return weight.dim() == 4 && weight.size(1) * weight.size(2) * weight.size(3) >= 32;
}
// The fused op with a 2x2/2 pool pools straight from the bf16 output and unpools straight into
// the bf16 gradient (pool_blocked.h): no conversion pass is left to pay for, and the pooling
// reads and the unpooling writes half the bytes (cnn, bf16, 1 thread: 5546 samples/s with conv1
// in bf16 against 5462 with it in f32, medians of 5 alternating runs).
bool bf16_pays_for_fused(const Tensor& weight, const kernels::Pool2dParams& pool) {
  const bool pool_2x2 = pool.kernel_h == 2 && pool.kernel_w == 2 && pool.stride_h == 2 &&
                        pool.stride_w == 2 && pool.pad_h == 0 && pool.pad_w == 0;
  return pool_2x2 || bf16_pays_for_convolution(weight);
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const kernels::Conv2dParams& params) {
  kernels::Conv2dParams p = params;
  p.bf16 = autocast_precision() == Precision::BF16 && bf16_pays_for_convolution(weight);
  Tensor y = kernels::conv2d_forward(x, weight, bias, p);
  if (p.relu) {
    // relu(conv(x)): the gradient passes where the output is positive, then through the conv.
    Tensor yd = y.detach();
    return record("Conv2dRelu", {x, weight, bias}, y,
                  [x, weight, p, yd](const Tensor& g, const Needs& n) {
                    const Tensor gr = kernels::unary_backward(UnaryOp::Relu, g, Tensor(), yd);
                    Tensor gx, gw, gb;
                    kernels::conv2d_backward(gr, x, weight, p, n[0] ? &gx : nullptr,
                                             n[1] ? &gw : nullptr, n[2] ? &gb : nullptr);
                    return Tensors{gx, gw, gb};
                  });
  }
  return record("Conv2d", {x, weight, bias}, y, [x, weight, p](const Tensor& g, const Needs& n) {
    Tensor gx, gw, gb;
    kernels::conv2d_backward(g, x, weight, p, n[0] ? &gx : nullptr, n[1] ? &gw : nullptr,
                             n[2] ? &gb : nullptr);
    return Tensors{gx, gw, gb};
  });
}

Tensor max_pool2d(const Tensor& x, const kernels::Pool2dParams& p) {
  Tensor argmax;
  Tensor y = kernels::max_pool2d_forward(x, p, argmax);
  const Shape s = x.shape();
  return record("MaxPool2d", {x}, y, [argmax, s](const Tensor& g, const Needs&) {
    return Tensors{kernels::max_pool2d_backward(g, argmax, s)};
  });
}

Tensor conv2d_relu_max_pool2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              const kernels::Conv2dParams& params,
                              const kernels::Pool2dParams& pool) {
  kernels::Conv2dParams p = params;
  p.relu = true;
  p.bf16 = autocast_precision() == Precision::BF16 && bf16_pays_for_fused(weight, pool);
  Tensor argmax;
  Tensor pooled = kernels::conv2d_relu_max_pool2d_forward(x, weight, bias, p, pool, argmax);
  // A window's winner passed the ReLU exactly when the window's maximum is positive (at 0, ReLU's
  // gradient is 0 too, as in PyTorch), so the ReLU's mask is applied to the pooled gradient, a
  // quarter of the elements for a 2x2 window, and the convolution's output need not be kept.
  const Tensor pd = pooled.detach();
  return record("Conv2dReluMaxPool2d", {x, weight, bias}, pooled,
                [x, weight, p, pool, pd, argmax](const Tensor& g, const Needs& n) {
                  Tensor gx, gw, gb;
                  kernels::conv2d_relu_max_pool2d_backward(
                      kernels::unary_backward(UnaryOp::Relu, g, Tensor(), pd), argmax, x, weight, p,
                      pool, n[0] ? &gx : nullptr, n[1] ? &gw : nullptr, n[2] ? &gb : nullptr);
                  return Tensors{gx, gw, gb};
                });
}

Tensor avg_pool2d(const Tensor& x, const kernels::Pool2dParams& p) {
  const Shape s = x.shape();
  return record("AvgPool2d", {x}, kernels::avg_pool2d_forward(x, p),
                [s, p](const Tensor& g, const Needs&) {
                  return Tensors{kernels::avg_pool2d_backward(g, s, p)};
                });
}

Tensor global_avg_pool2d(const Tensor& x) {
  if (x.dim() != 4) {
    throw std::invalid_argument("global_avg_pool2d: expected (N,C,H,W), got " + x.shape().str());
  }
  return mean(reshape(x, {x.size(0), x.size(1), x.size(2) * x.size(3)}), 2);
}

// ---- normalization, embedding, dropout -------------------------------------------------------

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, float momentum, float eps) {
  Tensor mean, invstd;
  Tensor y = kernels::batch_norm_forward(x, weight, bias, running_mean, running_var, training,
                                         momentum, eps, mean, invstd);
  return record("BatchNorm", {x, weight, bias}, y,
                [x, weight, mean, invstd, training](const Tensor& g, const Needs& n) {
                  Tensor gx, gw, gb;
                  kernels::batch_norm_backward(g, x, weight, mean, invstd, training,
                                               n[0] ? &gx : nullptr, n[1] ? &gw : nullptr,
                                               n[2] ? &gb : nullptr);
                  return Tensors{gx, gw, gb};
                });
}

Tensor layer_norm(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                  const Tensor& bias, float eps) {
  Tensor mean, rstd;
  Tensor y = kernels::layer_norm_forward(x, normalized, weight, bias, eps, mean, rstd);
  return record(
      "LayerNorm", {x, weight, bias}, y,
      [xs = SavedActivation(x), normalized, weight, mean, rstd](const Tensor& g, const Needs& n) {
        Tensor gx, gw, gb;
        kernels::layer_norm_backward(g, xs.get(), normalized, weight, mean, rstd,
                                     n[0] ? &gx : nullptr, n[1] ? &gw : nullptr,
                                     n[2] ? &gb : nullptr);
        return Tensors{gx, gw.defined() ? gw.reshape(weight.shape()) : gw,
                       gb.defined() ? gb.reshape(weight.shape()) : gb};
      });
}

Tensor embedding(const Tensor& table, const Tensor& indices) {
  return record("Embedding", {table}, kernels::embedding_forward(table, indices),
                [table, indices](const Tensor& g, const Needs&) {
                  Tensor gt = Tensor::zeros(table.shape(), DType::F32, table.device());
                  kernels::embedding_backward(g, indices, gt);
                  return Tensors{gt};
                });
}

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  if (p < 0.0f || p >= 1.0f) {
    throw std::invalid_argument("dropout probability must be in [0, 1), got " + std::to_string(p));
  }
  if (!training || p == 0.0f) return x;
  return mul(x, kernels::dropout_mask(x.shape(), p, gen));
}

// ---- softmax and losses ----------------------------------------------------------------------

Tensor softmax(const Tensor& x, int dim) {
  Tensor y = kernels::softmax(x, dim);
  Tensor yd = y.detach();
  return record("Softmax", {x}, y, [yd, dim](const Tensor& g, const Needs&) {
    return Tensors{kernels::softmax_backward(g, yd, dim)};
  });
}

Tensor log_softmax(const Tensor& x, int dim) {
  Tensor y = kernels::log_softmax(x, dim);
  Tensor yd = y.detach();
  return record("LogSoftmax", {x}, y, [yd, dim](const Tensor& g, const Needs&) {
    return Tensors{kernels::log_softmax_backward(g, yd, dim)};
  });
}

Tensor masked_softmax(const Tensor& x, const Tensor& mask, int dim) {
  return softmax(masked_fill(x, mask, -std::numeric_limits<float>::infinity()), dim);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, float label_smoothing,
                     std::int64_t ignore_index) {
  if (label_smoothing < 0.0f || label_smoothing > 1.0f) {
    throw std::invalid_argument("label_smoothing must be in [0, 1]");
  }
  Tensor probs;
  Tensor loss =
      kernels::cross_entropy_forward(logits, labels, label_smoothing, probs, ignore_index);
  return record("CrossEntropy", {logits}, loss,
                [probs, labels, label_smoothing, ignore_index](const Tensor& g, const Needs&) {
                  return Tensors{kernels::cross_entropy_backward(probs, labels, label_smoothing, g,
                                                                 ignore_index)};
                });
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& labels) {
  const Shape s = log_probs.shape();
  return record("NllLoss", {log_probs}, kernels::nll_loss_forward(log_probs, labels),
                [labels, s](const Tensor& g, const Needs&) {
                  return Tensors{kernels::nll_loss_backward(g, labels, s)};
                });
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  check_shape(target, input.shape(), "mse_loss: target");
  return mean(square(sub(input, target)));
}

Tensor kl_div(const Tensor& input_log_probs, const Tensor& target_probs) {
  return record("KlDiv", {input_log_probs, target_probs},
                kernels::kl_div_forward(input_log_probs, target_probs),
                [input_log_probs, target_probs](const Tensor& g, const Needs& n) {
                  Tensor gx, gt;
                  kernels::kl_div_backward(g, input_log_probs, target_probs, n[0] ? &gx : nullptr,
                                           n[1] ? &gt : nullptr);
                  return Tensors{gx, gt};
                });
}

// ---- attention -------------------------------------------------------------------------------

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    float scale) {
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(q.size(-1)));
  Tensor lse;
  if (autocast_precision() == Precision::BF16) {
    // q, k, v rounded once: the products' operands, and what backward keeps.
    const Tensor qb = kernels::to_bf16(q), kb = kernels::to_bf16(k), vb = kernels::to_bf16(v);
    Tensor y = kernels::attention_forward(qb, kb, vb, causal, scale, lse);
    return record("AttentionBF16", {q, k, v}, y,
                  [qb, kb, vb, ys = SavedActivation(y.detach()), lse, causal, scale](
                      const Tensor& g, const Needs& n) {
                    Tensor gq, gk, gv;
                    kernels::attention_backward(g, qb, kb, vb, ys.get(), lse, causal, scale,
                                                n[0] ? &gq : nullptr, n[1] ? &gk : nullptr,
                                                n[2] ? &gv : nullptr);
                    return Tensors{gq, gk, gv};
                  });
  }
  Tensor y = kernels::attention_forward(q, k, v, causal, scale, lse);
  return record(
      "Attention", {q, k, v}, y,
      [qs = SavedActivation(q), ks = SavedActivation(k), vs = SavedActivation(v),
       ys = SavedActivation(y.detach()), lse, causal, scale](const Tensor& g, const Needs& n) {
        Tensor gq, gk, gv;
        kernels::attention_backward(g, qs.get(), ks.get(), vs.get(), ys.get(), lse, causal, scale,
                                    n[0] ? &gq : nullptr, n[1] ? &gk : nullptr,
                                    n[2] ? &gv : nullptr);
        return Tensors{gq, gk, gv};
      });
}

Tensor packed_self_attention(const Tensor& qkv, std::int64_t heads, bool causal, float scale) {
  const bool bf16 = autocast_precision() == Precision::BF16;
  Tensor q, k, v, lse;
  kernels::split_qkv_heads(qkv, heads, bf16 ? DType::BF16 : DType::F32, q, k, v);
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(q.size(-1)));
  if (bf16) {
    Tensor y = kernels::attention_forward(q, k, v, causal, scale, lse);
    return record("PackedAttentionBF16", {qkv}, kernels::merge_heads(y),
                  [q, k, v, ys = SavedActivation(y), lse, causal, scale, heads](const Tensor& g,
                                                                                const Needs&) {
                    Tensor gq, gk, gv;
                    kernels::attention_backward(kernels::split_heads(g, heads), q, k, v, ys.get(),
                                                lse, causal, scale, &gq, &gk, &gv);
                    return Tensors{kernels::merge_qkv_heads(gq, gk, gv)};
                  });
  }
  Tensor y = kernels::attention_forward(q, k, v, causal, scale, lse);
  return record(
      "PackedAttention", {qkv}, kernels::merge_heads(y),
      [qs = SavedActivation(q), ks = SavedActivation(k), vs = SavedActivation(v),
       ys = SavedActivation(y), lse, causal, scale, heads](const Tensor& g, const Needs&) {
        Tensor gq, gk, gv;
        kernels::attention_backward(kernels::split_heads(g, heads), qs.get(), ks.get(), vs.get(),
                                    ys.get(), lse, causal, scale, &gq, &gk, &gv);
        return Tensors{kernels::merge_qkv_heads(gq, gk, gv)};
      });
}

}  // namespace hpm
