// Element-wise maps, broadcasting and reductions.
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "broadcast.h"
#include "f32_block.h"
#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/random.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::cpu {

namespace {

// GELU, exact (erf) form, as torch.nn.GELU(): y = x Phi(x), dy/dx = Phi(x) + x phi(x).
HPM_SIMD_CLONES void gelu_span(const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * vec::normal_cdf_pdf(x[i]).cdf;
}

HPM_SIMD_CLONES void gelu_backward_span(const float* g, const float* x, float* dx, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const vec::NormalCdfPdf c = vec::normal_cdf_pdf(x[i]);
    dx[i] = g[i] * (c.cdf + x[i] * c.pdf);
  }
}

HPM_SIMD_CLONES void exp_span(const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = vec::exp(x[i]);
}

// In double, lane by lane: a gradient norm over millions of elements keeps its digits.
HPM_SIMD_CLONES double sum_squares_span(const float* p, std::int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}

template <typename Op>
void binary_loop(const float* a, const float* b, float* y, std::int64_t n, Op op) {
  parallel_for(n, kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
#pragma omp simd
    for (std::int64_t i = lo; i < hi; ++i) y[i] = op(a[i], b[i]);
  });
}

template <typename Op>
Tensor binary_impl(const Tensor& a, const Tensor& b, Op op) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  if (a.shape() == b.shape()) {
    Tensor y = Tensor::empty(a.shape(), DType::F32, a.device());
    binary_loop(pa, pb, y.data<float>(), a.numel(), op);
    return y;
  }
  const Shape out = broadcast_shapes(a.shape(), b.shape());
  Tensor y = Tensor::empty(out, DType::F32, a.device());
  float* py = y.data<float>();
  const std::int64_t n = out.numel();
  if (b.numel() == 1 && a.numel() == n) {
    const float s = pb[0];
    for (std::int64_t i = 0; i < n; ++i) py[i] = op(pa[i], s);
  } else if (a.numel() == 1 && b.numel() == n) {
    const float s = pa[0];
    for (std::int64_t i = 0; i < n; ++i) py[i] = op(s, pb[i]);
  } else if (a.numel() == n && b.numel() > 0 && out.numel_from(out.rank() - b.dim()) == b.numel() &&
             Shape(std::vector<std::int64_t>(out.dims().end() - b.dim(), out.dims().end())) ==
                 b.shape()) {
    // b repeats along the leading dimensions (a bias row): the common case.
    const std::int64_t inner = b.numel();
    for (std::int64_t o = 0; o < n; o += inner)
      for (std::int64_t j = 0; j < inner; ++j) py[o + j] = op(pa[o + j], pb[j]);
  } else {
    for_each_broadcast(
        out, broadcast_strides(a.shape(), out), broadcast_strides(b.shape(), out),
        [&](std::int64_t o, std::int64_t ia, std::int64_t ib) { py[o] = op(pa[ia], pb[ib]); });
  }
  return y;
}

template <typename Op>
Tensor unary_impl(const Tensor& x, Op op) {
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) py[i] = op(px[i]);
  });
  return y;
}

constexpr float kSqrt2OverPi = 0.79788456080286535588f;

}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case BinaryOp::Add:
      return binary_impl(a, b, [](float u, float v) { return u + v; });
    case BinaryOp::Sub:
      return binary_impl(a, b, [](float u, float v) { return u - v; });
    case BinaryOp::Mul:
      return binary_impl(a, b, [](float u, float v) { return u * v; });
    case BinaryOp::Div:
      return binary_impl(a, b, [](float u, float v) { return u / v; });
  }
  throw std::logic_error("unknown binary op");
}

Tensor add_scalar(const Tensor& a, float s) {
  return unary_impl(a, [s](float v) { return v + s; });
}

Tensor mul_scalar(const Tensor& a, float s) {
  return unary_impl(a, [s](float v) { return v * s; });
}

void axpy_(Tensor& y, float alpha, const Tensor& x) {
  if (y.numel() != x.numel()) {
    throw std::invalid_argument("axpy_: " + y.shape().str() + " += " + x.shape().str());
  }
  float* py = y.data<float>();
  const float* px = x.data<float>();
  parallel_for(y.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
#pragma omp simd
    for (std::int64_t i = lo; i < hi; ++i) py[i] += alpha * px[i];
  });
}

void scale_(Tensor& y, float alpha) {
  float* py = y.data<float>();
  parallel_for(y.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
#pragma omp simd
    for (std::int64_t i = lo; i < hi; ++i) py[i] *= alpha;
  });
}

namespace {

// One unary op over a span. unary() runs it span by span across the kernel threads and
// unary_bf16() block by block into a rounding: the same code, so the same values, bit for bit.
void unary_span(UnaryOp op, const float* x, float* y, std::int64_t n) {
  const auto map = [&](auto f) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  };
  switch (op) {
    case UnaryOp::Neg:
      return map([](float v) { return -v; });
    case UnaryOp::Exp:
      return exp_span(x, y, n);
    case UnaryOp::Log:
      return map([](float v) { return std::log(v); });
    case UnaryOp::Sqrt:
      return map([](float v) { return std::sqrt(v); });
    case UnaryOp::Relu:
      // NaN passes, as torch.relu's: mapped to 0 it hid a diverged activation from the loss (the
      // run went on with NaN weights behind finite losses).
      return map([](float v) { return v < 0.0f ? 0.0f : v; });
    case UnaryOp::Tanh:
      return map([](float v) { return std::tanh(v); });
    case UnaryOp::Sigmoid:
      return map([](float v) { return 1.0f / (1.0f + std::exp(-v)); });
    case UnaryOp::Gelu:
      return gelu_span(x, y, n);
    case UnaryOp::GeluTanh:
      return map([](float v) {
        return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
      });
    case UnaryOp::Square:
      return map([](float v) { return v * v; });
  }
  throw std::logic_error("unknown unary op");
}

// dL/dx of a unary op over a span, from dL/dy (g), the input x and the output y (either may be
// null where the op does not read it).
void unary_backward_span(UnaryOp op, const float* g, const float* x, const float* y, float* out,
                         std::int64_t n) {
  const auto map = [&](auto f) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = f(g[i], x ? x[i] : 0.0f, y ? y[i] : 0.0f);
  };
  switch (op) {
    case UnaryOp::Neg:
      return map([](float dy, float, float) { return -dy; });
    case UnaryOp::Exp:
      return map([](float dy, float, float v) { return dy * v; });
    case UnaryOp::Log:
      return map([](float dy, float u, float) { return dy / u; });
    case UnaryOp::Sqrt:
      return map([](float dy, float, float v) { return 0.5f * dy / v; });
    case UnaryOp::Relu:
      // The hot one in every mlp and cnn: a branch-free masked copy.
#pragma omp simd
      for (std::int64_t i = 0; i < n; ++i) {
        const float dy = g[i];              // loaded unconditionally so the select vectorizes
        out[i] = y[i] <= 0.0f ? 0.0f : dy;  // torch's threshold_backward: NaN passes dy
      }
      return;
    case UnaryOp::Tanh:
      return map([](float dy, float, float v) { return dy * (1 - v * v); });
    case UnaryOp::Sigmoid:
      return map([](float dy, float, float v) { return dy * v * (1 - v); });
    case UnaryOp::Gelu:
      return gelu_backward_span(g, x, out, n);
    case UnaryOp::GeluTanh:
      return map([](float dy, float u, float) {
        const float inner = kSqrt2OverPi * (u + 0.044715f * u * u * u);
        const float t = std::tanh(inner);
        const float dinner = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * u * u);
        return dy * (0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * dinner);
      });
    case UnaryOp::Square:
      return map([](float dy, float u, float) { return 2.0f * dy * u; });
  }
  throw std::logic_error("unknown unary op");
}

// Elements a fused op computes at once: its f32 values stay in L1 until they are rounded, and
// no f32 tensor of the whole (a bf16 operand's f32 original) is ever allocated.
constexpr std::int64_t kFusedBlock = 2048;

// f(lo, n) over [0, total) in blocks of at most kFusedBlock elements, across the kernel threads.
template <typename F>
void for_blocks(std::int64_t total, F&& f) {
  parallel_for(total, kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t b = lo; b < hi; b += kFusedBlock) f(b, std::min(kFusedBlock, hi - b));
  });
}

bool any_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && t->dtype() == DType::BF16) return true;
  return false;
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    unary_span(op, px + lo, py + lo, hi - lo);
  });
  return y;
}

void scale_by_(Tensor& y, float s) {
  if (s == 1.0f) return;
  if (y.dtype() == DType::F32) {
    scale_(y, s);
    return;
  }
  auto* py = y.data<std::uint16_t>();
  for_blocks(y.numel(), [&](std::int64_t lo, std::int64_t n) {
    float block[kFusedBlock];
    bf16_to_f32(py + lo, block, n);
    for (std::int64_t i = 0; i < n; ++i) block[i] *= s;
    f32_to_bf16(block, py + lo, n);
  });
}

Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16) {
  Tensor y = Tensor::empty(x.shape(), DType::BF16, x.device());
  const bool widen = x.dtype() == DType::BF16;
  std::uint16_t* pxb = nullptr;
  if (x_bf16 != nullptr && widen) {
    *x_bf16 = x;  // already its own bf16 copy
  } else if (x_bf16 != nullptr) {
    *x_bf16 = Tensor::empty(x.shape(), DType::BF16, x.device());
    pxb = x_bf16->data<std::uint16_t>();
  }
  auto* py = y.data<std::uint16_t>();
  for_blocks(x.numel(), [&](std::int64_t lo, std::int64_t n) {
    float in[kFusedBlock], block[kFusedBlock];
    const float* px = f32_block(x, lo, n, in);
    unary_span(op, px, block, n);
    f32_to_bf16(block, py + lo, n);
    if (pxb != nullptr) f32_to_bf16(px, pxb + lo, n);
  });
  return y;
}

namespace {

// unary_backward into `out` (F32 or BF16), block by block, widening BF16 inputs as it goes.
void unary_backward_into(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y,
                         Tensor& out) {
  const bool round = out.dtype() == DType::BF16;
  for_blocks(out.numel(), [&](std::int64_t lo, std::int64_t n) {
    float gb[kFusedBlock], xb[kFusedBlock], yb[kFusedBlock], ob[kFusedBlock];
    float* o = round ? ob : out.data<float>() + lo;
    unary_backward_span(op, f32_block(grad_y, lo, n, gb), f32_block(x, lo, n, xb),
                        f32_block(y, lo, n, yb), o, n);
    if (round) f32_to_bf16(ob, out.data<std::uint16_t>() + lo, n);
  });
}

}  // namespace

Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y) {
  Tensor out = Tensor::empty(grad_y.shape(), DType::F32, grad_y.device());
  if (any_bf16({&grad_y, &x, &y})) {  // bf16 copies kept for backward: widened block by block
    unary_backward_into(op, grad_y, x, y, out);
    return out;
  }
  const float* pg = grad_y.data<float>();
  const float* px = x.defined() ? x.data<float>() : nullptr;
  const float* py = y.defined() ? y.data<float>() : nullptr;
  float* po = out.data<float>();
  parallel_for(out.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    unary_backward_span(op, pg + lo, px ? px + lo : nullptr, py ? py + lo : nullptr, po + lo,
                        hi - lo);
  });
  return out;
}

Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y) {
  Tensor out = Tensor::empty(grad_y.shape(), DType::BF16, grad_y.device());
  unary_backward_into(op, grad_y, x, y, out);
  return out;
}

// ---- reductions --------------------------------------------------------------------------

float sum_all(const Tensor& x) {
  const float* p = x.data<float>();
  double s = 0.0;
  for (std::int64_t i = 0; i < x.numel(); ++i) s += p[i];
  return static_cast<float>(s);
}

double sum_squares(const Tensor& x) { return sum_squares_span(x.data<float>(), x.numel()); }

Tensor sum_dim(const Tensor& x, int dim, bool keepdim) {
  const int d = x.shape().wrap(dim);
  const std::int64_t outer = x.shape().numel_before(d);
  const std::int64_t len = x.size(d), inner = x.shape().numel_from(d + 1);
  std::vector<std::int64_t> dims = x.shape().dims();
  if (keepdim) {
    dims[static_cast<std::size_t>(d)] = 1;
  } else {
    dims.erase(dims.begin() + d);
  }
  Tensor y = Tensor::zeros(Shape(dims), DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t l = 0; l < len; ++l) {
      const float* row = px + (o * len + l) * inner;
      float* dst = py + o * inner;
      for (std::int64_t i = 0; i < inner; ++i) dst[i] += row[i];
    }
  return y;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  if (shape.numel() == 1) return Tensor::full(shape, sum_all(x), x.device());
  Tensor y = Tensor::zeros(shape, DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const std::int64_t n = x.numel(), inner = shape.numel();
  if (shape.rank() <= x.shape().rank() && x.shape().numel_from(x.dim() - shape.rank()) == inner &&
      Shape(std::vector<std::int64_t>(x.shape().dims().end() - shape.rank(),
                                      x.shape().dims().end())) == shape) {
    for (std::int64_t o = 0; o < n; o += inner)
      for (std::int64_t j = 0; j < inner; ++j) py[j] += px[o + j];
    return y;
  }
  const Shape& out = x.shape();
  const auto sy = broadcast_strides(shape, out);
  for_each_broadcast(out, sy, sy,
                     [&](std::int64_t o, std::int64_t iy, std::int64_t) { py[iy] += px[o]; });
  return y;
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  Tensor y = Tensor::empty(shape, DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const auto sx = broadcast_strides(x.shape(), shape);
  for_each_broadcast(shape, sx, sx,
                     [&](std::int64_t o, std::int64_t ix, std::int64_t) { py[o] = px[ix]; });
  return y;
}

Tensor argmax_last(const Tensor& x) {
  // Refused as the GPU's is (it divided by zero, SIGFPE).
  if (x.dim() == 0 || x.size(-1) == 0)
    throw std::invalid_argument("argmax_last: empty last dimension in " + x.shape().str());
  const std::int64_t d = x.size(-1), rows = x.numel() / d;
  std::vector<std::int64_t> dims(x.shape().dims().begin(), x.shape().dims().end() - 1);
  Tensor y = Tensor::empty(Shape(dims), DType::I64, x.device());
  // A BF16 row is widened first (bf16 values compare as their f32 widenings do).
  std::vector<float> widened(x.dtype() == DType::BF16 ? static_cast<std::size_t>(d) : 0);
  auto* py = y.data<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = f32_block(x, r * d, d, widened.data());
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < d; ++j)
      if (row[j] > row[best]) best = j;
    py[r] = best;
  }
  return y;
}

// ---- layout --------------------------------------------------------------------------------

Tensor transpose2d(const Tensor& x) {
  if (x.dim() != 2) throw std::invalid_argument("transpose2d needs 2-D, got " + x.shape().str());
  const std::int64_t r = x.size(0), c = x.size(1);
  Tensor y = Tensor::empty({c, r}, DType::F32, x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  constexpr std::int64_t kBlock = 32;
  for (std::int64_t i0 = 0; i0 < r; i0 += kBlock)
    for (std::int64_t j0 = 0; j0 < c; j0 += kBlock)
      for (std::int64_t i = i0; i < std::min(r, i0 + kBlock); ++i)
        for (std::int64_t j = j0; j < std::min(c, j0 + kBlock); ++j) py[j * r + i] = px[i * c + j];
  return y;
}

Tensor permute(const Tensor& x, const std::vector<int>& perm) {
  const int r = x.dim();
  if (static_cast<int>(perm.size()) != r) {
    throw std::invalid_argument("permute: " + std::to_string(perm.size()) +
                                " axes for a tensor of rank " + std::to_string(r));
  }
  std::vector<std::int64_t> out_dims(static_cast<std::size_t>(r));
  std::vector<std::int64_t> in_strides(static_cast<std::size_t>(r));
  std::int64_t stride = 1;
  for (int i = r - 1; i >= 0; --i) {
    in_strides[static_cast<std::size_t>(i)] = stride;
    stride *= x.size(i);
  }
  std::vector<std::int64_t> src_strides(static_cast<std::size_t>(r));
  std::vector<bool> seen(static_cast<std::size_t>(r), false);
  for (int i = 0; i < r; ++i) {
    const int p = x.shape().wrap(perm[static_cast<std::size_t>(i)]);
    if (seen[static_cast<std::size_t>(p)]) throw std::invalid_argument("permute: repeated axis");
    seen[static_cast<std::size_t>(p)] = true;
    out_dims[static_cast<std::size_t>(i)] = x.size(p);
    src_strides[static_cast<std::size_t>(i)] = in_strides[static_cast<std::size_t>(p)];
  }
  const Shape out(out_dims);
  Tensor y = Tensor::empty(out, x.dtype(), x.device());
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for_each_broadcast(out, src_strides, src_strides,
                     [&](std::int64_t o, std::int64_t i, std::int64_t) { py[o] = px[i]; });
  return y;
}

Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices) {
  Shape s = x.shape();
  s[0] = static_cast<std::int64_t>(indices.size());
  Tensor y = Tensor::empty(s, x.dtype(), x.device());
  const std::size_t row = static_cast<std::size_t>(x.shape().numel_from(1)) * dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(y.raw_data());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= x.size(0)) {
      throw std::out_of_range("index_select0: index " + std::to_string(indices[i]) +
                              " out of range for " + std::to_string(x.size(0)) + " rows");
    }
    std::memcpy(dst + i * row, src + static_cast<std::size_t>(indices[i]) * row, row);
  }
  return y;
}

// ---- embedding -----------------------------------------------------------------------------

Tensor embedding_forward(const Tensor& table, const Tensor& indices) {
  const std::int64_t v = table.size(0), e = table.size(1);
  std::vector<std::int64_t> dims = indices.shape().dims();
  dims.push_back(e);
  Tensor y = Tensor::empty(Shape(dims), DType::F32, table.device());
  const auto* idx = indices.data<std::int64_t>();
  const float* pt = table.data<float>();
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < indices.numel(); ++i) {
    if (idx[i] < 0 || idx[i] >= v) {
      throw std::out_of_range("embedding: index " + std::to_string(idx[i]) + " at position " +
                              std::to_string(i) + " out of range for " + std::to_string(v) +
                              " rows");
    }
    std::memcpy(py + i * e, pt + idx[i] * e, static_cast<std::size_t>(e) * sizeof(float));
  }
  return y;
}

void embedding_backward(const Tensor& grad_y, const Tensor& indices, Tensor& grad_table) {
  const std::int64_t e = grad_table.size(1);
  const auto* idx = indices.data<std::int64_t>();
  const float* pg = grad_y.data<float>();
  float* pt = grad_table.data<float>();
  const std::int64_t rows = grad_table.size(0);
  for (std::int64_t i = 0; i < indices.numel(); ++i) {
    // Checked as the forward checks: an index changed since would write past the table.
    if (idx[i] < 0 || idx[i] >= rows) {
      throw std::out_of_range("embedding_backward: index " + std::to_string(idx[i]) +
                              " at position " + std::to_string(i) + " is outside the table of " +
                              std::to_string(rows) + " rows");
    }
    for (std::int64_t j = 0; j < e; ++j) pt[idx[i] * e + j] += pg[i * e + j];
  }
}

Tensor dropout_mask(const Shape& shape, float p, Generator& gen) {
  Tensor m = Tensor::empty(shape, DType::F32);
  float* pm = m.data<float>();
  const float keep = 1.0f / (1.0f - p);
  for (std::int64_t i = 0; i < m.numel(); ++i) pm[i] = gen.uniform() < p ? 0.0f : keep;
  return m;
}

}  // namespace hpm::cpu
