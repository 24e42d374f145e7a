// Joining, slicing and selecting: concat along a dimension, a copied slice along a dimension,
// where(cond, a, b) and masked fill. Masks are I8 (0 = false), broadcast NumPy-style.
#include <cstring>
#include <limits>
#include <stdexcept>

#include "broadcast.h"
#include "hpm/tensor/backend/cpu.h"

namespace hpm::cpu {

namespace {

// A tensor seen as (outer, len * inner) rows around dimension d: concat and slices along d copy
// whole (len_part * inner)-element runs per outer index.
struct Around {
  std::int64_t outer, inner;
};

Around around(const Shape& s, int d) { return {s.numel_before(d), s.numel_from(d + 1)}; }

void check_mask(const Tensor& mask, const char* what) {
  if (mask.dtype() != DType::I8) {
    throw std::invalid_argument(std::string(what) + ": the mask must be I8 (0 or 1), got " +
                                dtype_name(mask.dtype()));
  }
}

}  // namespace

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  if (xs.empty()) throw std::invalid_argument("concat: no tensors");
  const Shape& first = xs[0].shape();
  const int d = first.wrap(dim);
  Shape out = first;
  out[d] = 0;
  for (const Tensor& x : xs) {
    bool same = x.dim() == first.rank() && x.dtype() == xs[0].dtype();
    for (int i = 0; same && i < first.rank(); ++i) same = i == d || x.size(i) == first[i];
    if (!same) {
      throw std::invalid_argument("concat: " + x.shape().str() + " does not match " + first.str() +
                                  " outside dimension " + std::to_string(d));
    }
    out[d] += x.size(d);
  }
  Tensor y = Tensor::empty(out, xs[0].dtype(), xs[0].device());
  const std::size_t esize = dtype_size(y.dtype());
  const Around a = around(out, d);
  char* py = static_cast<char*>(y.raw_data());
  std::int64_t at = 0;  // elements into each output row where this input starts
  for (const Tensor& x : xs) {
    const std::int64_t run = x.size(d) * a.inner;
    const char* px = static_cast<const char*>(x.raw_data());
    for (std::int64_t o = 0; o < a.outer; ++o) {
      std::memcpy(py + static_cast<std::size_t>(o * out[d] * a.inner + at) * esize,
                  px + static_cast<std::size_t>(o * run) * esize,
                  static_cast<std::size_t>(run) * esize);
    }
    at += run;
  }
  return y;
}

Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length) {
  const int d = x.shape().wrap(dim);
  if (start < 0 || length < 0 || start + length > x.size(d)) {
    throw std::out_of_range("narrow: [" + std::to_string(start) + ", " +
                            std::to_string(start + length) + ") is outside dimension " +
                            std::to_string(d) + " of " + x.shape().str());
  }
  Shape out = x.shape();
  out[d] = length;
  Tensor y = Tensor::empty(out, x.dtype(), x.device());
  const std::size_t esize = dtype_size(x.dtype());
  const Around a = around(x.shape(), d);
  const char* px = static_cast<const char*>(x.raw_data());
  char* py = static_cast<char*>(y.raw_data());
  const std::int64_t run = length * a.inner;
  for (std::int64_t o = 0; o < a.outer; ++o) {
    std::memcpy(py + static_cast<std::size_t>(o * run) * esize,
                px + static_cast<std::size_t>((o * x.size(d) + start) * a.inner) * esize,
                static_cast<std::size_t>(run) * esize);
  }
  return y;
}

void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part) {
  const int d = y.shape().wrap(dim);
  const Around a = around(y.shape(), d);
  const std::int64_t run = part.size(d) * a.inner;
  const float* pp = part.data<float>();
  float* py = y.data<float>();
  for (std::int64_t o = 0; o < a.outer; ++o) {
    float* dst = py + (o * y.size(d) + start) * a.inner;
    const float* src = pp + o * run;
    for (std::int64_t i = 0; i < run; ++i) dst[i] += src[i];
  }
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_mask(cond, "where");
  const Shape out = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape()));
  const auto sc = broadcast_strides(cond.shape(), out), sa = broadcast_strides(a.shape(), out),
             sb = broadcast_strides(b.shape(), out);
  Tensor y = Tensor::empty(out, DType::F32, a.device());
  const auto* pc = static_cast<const std::int8_t*>(cond.raw_data());
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    py[i] = pc[broadcast_offset(i, out, sc)] != 0 ? pa[broadcast_offset(i, out, sa)]
                                                  : pb[broadcast_offset(i, out, sb)];
  }
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  check_mask(mask, "masked_fill");
  if (broadcast_shapes(x.shape(), mask.shape()) != x.shape()) {
    throw std::invalid_argument("masked_fill: mask " + mask.shape().str() +
                                " does not broadcast to " + x.shape().str());
  }
  Tensor y = x.clone();
  float* py = y.data<float>();
  const auto* pm = static_cast<const std::int8_t*>(mask.raw_data());
  for_each_broadcast(x.shape(), broadcast_strides(mask.shape(), x.shape()),
                     broadcast_strides(mask.shape(), x.shape()),
                     [&](std::int64_t o, std::int64_t m, std::int64_t) {
                       if (pm[m] != 0) py[o] = value;
                     });
  return y;
}

}  // namespace hpm::cpu
