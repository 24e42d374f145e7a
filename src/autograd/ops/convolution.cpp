// Convolution and pooling (and their fusions) and their gradient rules.
// Rules save inputs as they are and outputs detached (an output saving itself would be a
// reference cycle).
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include "autograd/ops/common.h"
#include "hpm/autograd/deferred.h"

namespace hpm {

// ---- convolution and pooling ---------------------------------------------------------------

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              const kernels::Conv2dParams& params) {
  kernels::Conv2dParams p = params;
  p.bf16 = autocast_precision() == Precision::BF16;  // the backend decides where it pays
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
  p.bf16 = autocast_precision() == Precision::BF16;
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

}  // namespace hpm
