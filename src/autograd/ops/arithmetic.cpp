// Arithmetic, element-wise functions, reductions, shape and selection: their gradient rules.
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
Tensor unary_op(const char* name, UnaryOp op, const Tensor& x) {
  Tensor y = kernels::unary(op, x);
  if (op == UnaryOp::Gelu) {
    // Its backward needs the input alone: the output (as wide as the input) is not kept.
    return record(name, {x}, y, [op, xs = SavedActivation(x)](const Tensor& g, const Needs&) {
      return Tensors{kernels::unary_backward(op, g, xs.kept(), Tensor())};
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
  return record(
      "Reshape", {x}, x.reshape(shape),
      [s](const Tensor& g, const Needs&) { return Tensors{g.reshape(s)}; }, Bf16Grad::kPassedOn);
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

}  // namespace hpm
