// Broadcasting's index arithmetic, shared by the element-wise kernels and the selection kernels
// (where, masked fill).
#pragma once
#include <cstdint>
#include <vector>

#include "hpm/tensor/shape.h"

namespace hpm::cpu {

// Strides of `s` as seen from the broadcast shape `out` (0 along broadcast dimensions).
inline std::vector<std::int64_t> broadcast_strides(const Shape& s, const Shape& out) {
  std::vector<std::int64_t> st(static_cast<std::size_t>(out.rank()), 0);
  std::int64_t stride = 1;
  for (int i = s.rank() - 1, j = out.rank() - 1; i >= 0; --i, --j) {
    st[static_cast<std::size_t>(j)] = s[i] == 1 ? 0 : stride;
    stride *= s[i];
  }
  return st;
}

// Calls f(out_index, a_index, b_index) for every element of `out` in row-major order.
template <typename F>
void for_each_broadcast(const Shape& out, const std::vector<std::int64_t>& sa,
                        const std::vector<std::int64_t>& sb, F&& f) {
  const int r = out.rank();
  const std::int64_t n = out.numel();
  if (r == 0) {
    f(0, 0, 0);
    return;
  }
  std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
  const std::int64_t inner = out[r - 1];
  const std::int64_t ia_step = sa[static_cast<std::size_t>(r - 1)];
  const std::int64_t ib_step = sb[static_cast<std::size_t>(r - 1)];
  std::int64_t ia = 0, ib = 0;
  for (std::int64_t o = 0; o < n; o += inner) {
    for (std::int64_t j = 0; j < inner; ++j) f(o + j, ia + j * ia_step, ib + j * ib_step);
    // Advance the multi-index over the outer dimensions.
    for (int d = r - 2; d >= 0; --d) {
      const auto du = static_cast<std::size_t>(d);
      ++idx[du];
      ia += sa[du];
      ib += sb[du];
      if (idx[du] < out[d]) break;
      ia -= sa[du] * out[d];
      ib -= sb[du] * out[d];
      idx[du] = 0;
    }
  }
}

// Offset in an operand with broadcast strides `st` (from broadcast_strides) of element `flat` of
// `out`: the random-access form of for_each_broadcast, for kernels with more than two operands.
inline std::int64_t broadcast_offset(std::int64_t flat, const Shape& out,
                                     const std::vector<std::int64_t>& st) {
  std::int64_t offset = 0;
  for (int d = out.rank() - 1; d >= 0; --d) {
    offset += (flat % out[d]) * st[static_cast<std::size_t>(d)];
    flat /= out[d];
  }
  return offset;
}

}  // namespace hpm::cpu
