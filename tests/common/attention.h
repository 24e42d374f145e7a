// packed_self_attention spelled out in the ops it fuses: the reference its tests compare to.
#pragma once
#include <vector>

#include "hpm/autograd/ops.h"

namespace hpm::test {

// (B, T, 3E) -> (3, B, H, T, D) by a permute, split into q, k and v, attended, and the heads
// merged back (B, T, E) by another permute.
inline Tensor composed_packed_attention(const Tensor& qkv, std::int64_t heads, bool causal) {
  const std::int64_t b = qkv.size(0), t = qkv.size(1), e = qkv.size(2) / 3, d = e / heads;
  const Tensor all = permute(reshape(qkv, {b, t, 3, heads, d}), {2, 0, 3, 1, 4});
  std::vector<Tensor> parts = split(all, 1, 0);
  for (Tensor& p : parts) p = reshape(p, {b, heads, t, d});
  const Tensor y = scaled_dot_product_attention(parts[0], parts[1], parts[2], causal);
  return reshape(permute(y, {0, 2, 1, 3}), {b, t, e});
}

}  // namespace hpm::test
