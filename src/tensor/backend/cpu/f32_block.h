// A span of an F32 or BF16 tensor as floats: the kernels that read either dtype (a saved bf16
// activation, bf16 logits) widen a block at a time into a buffer of their own instead of a
// whole f32 copy.
#pragma once
#include <cstdint>

#include "hpm/tensor/backend/cpu.h"

namespace hpm::cpu {

// Elements [lo, lo + n) of x as f32: x's own (F32), or widened into buf (a BF16 copy); null for
// an undefined x.
inline const float* f32_block(const Tensor& x, std::int64_t lo, std::int64_t n, float* buf) {
  if (!x.defined()) return nullptr;
  if (x.dtype() != DType::BF16) return x.data<float>() + lo;
  bf16_to_f32(x.data<std::uint16_t>() + lo, buf, n);
  return buf;
}

}  // namespace hpm::cpu
