// Stacking elements into a batch, shared by batch/padded_batch and the fused map-and-batch.
#include "stack.h"

#include <algorithm>
#include <cstring>

namespace hpm::data {

// Stacks component c of every element along a new first dimension, padding to the largest shape
// when `pad` (else every shape must agree).
Tensor stack_component(const std::vector<Element>& items, std::size_t c, bool pad, float pad_value,
                       const char* stage) {
  const Tensor& first = items[0][c];
  std::vector<std::int64_t> dims = first.shape().dims();
  for (const auto& e : items) {
    const Tensor& t = e[c];
    if (t.dtype() != first.dtype() || t.dim() != first.dim()) {
      throw DataError(stage, "component " + std::to_string(c) + " mixes " + first.shape().str() +
                                 " and " + t.shape().str() + " (or dtypes)");
    }
    for (int d = 0; d < t.dim(); ++d) {
      if (t.size(d) != dims[static_cast<std::size_t>(d)]) {
        if (!pad) {
          throw DataError(stage, "component " + std::to_string(c) + " has shapes " +
                                     first.shape().str() + " and " + t.shape().str() +
                                     " in one batch; use padded_batch");
        }
        dims[static_cast<std::size_t>(d)] = std::max(dims[static_cast<std::size_t>(d)], t.size(d));
      }
    }
  }
  std::vector<std::int64_t> out_dims{static_cast<std::int64_t>(items.size())};
  out_dims.insert(out_dims.end(), dims.begin(), dims.end());
  const Shape item_shape(dims);
  Tensor out = pad ? Tensor::empty(Shape(out_dims), first.dtype())
                   : Tensor::empty(Shape(out_dims), first.dtype());
  const std::size_t esize = dtype_size(first.dtype());
  const std::size_t item_bytes = static_cast<std::size_t>(item_shape.numel()) * esize;
  char* dst = static_cast<char*>(out.raw_data());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Tensor& t = items[i][c];
    char* d = dst + i * item_bytes;
    if (t.shape() == item_shape) {
      std::memcpy(d, t.raw_data(), item_bytes);
      continue;
    }
    // Padded copy: fill, then copy the tensor's rows (over its last dimension) into place.
    Tensor filler = Tensor::full(item_shape, pad_value);
    if (first.dtype() == DType::F32) {
      std::memcpy(d, filler.raw_data(), item_bytes);
    } else if (first.dtype() == DType::I64) {
      auto* p = reinterpret_cast<std::int64_t*>(d);
      for (std::int64_t k = 0; k < item_shape.numel(); ++k)
        p[k] = static_cast<std::int64_t>(pad_value);
    } else {
      std::memset(d, 0, item_bytes);
    }
    const int r = t.dim();
    if (t.numel() == 0) continue;
    const std::int64_t inner = r == 0 ? 1 : t.size(r - 1);
    const std::int64_t rows = t.numel() / inner;
    for (std::int64_t row = 0; row < rows; ++row) {
      // Multi-index of this row in t, then its offset in the padded item.
      std::int64_t rem = row, offset = 0, stride = inner == 0 ? 0 : dims.back();
      for (int dd = r - 2; dd >= 0; --dd) {
        const std::int64_t idx = rem % t.size(dd);
        rem /= t.size(dd);
        offset += idx * stride;
        stride *= dims[static_cast<std::size_t>(dd)];
      }
      std::memcpy(
          d + static_cast<std::size_t>(offset) * esize,
          static_cast<const char*>(t.raw_data()) + static_cast<std::size_t>(row * inner) * esize,
          static_cast<std::size_t>(inner) * esize);
    }
  }
  return out;
}

Element stack_elements(const std::vector<Element>& items, bool pad, float pad_value,
                       const char* stage) {
  Element out;
  for (const auto& it : items)
    if (it.size() != items[0].size()) throw DataError(stage, "elements have different arity");
  for (std::size_t c = 0; c < items[0].size(); ++c)
    out.push_back(stack_component(items, c, pad, pad_value, stage));
  return out;
}

}  // namespace hpm::data
