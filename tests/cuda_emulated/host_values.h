// What the emulated kernels' tests share: a tensor's values as a host vector (the kernels' operands
// and the CPU's results compared with them) and a bf16 value widened to f32.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "hpm/tensor/tensor.h"

namespace hpm::emulated {

// The values of a CPU tensor of element type T (std::uint16_t for BF16's bits).
template <typename T = float>
std::vector<T> copy_of(const Tensor& t) {
  const T* p = t.data<T>();
  return std::vector<T>(p, p + t.numel());
}

inline float widened(std::uint16_t bf16_bits) {
  const std::uint32_t bits = std::uint32_t{bf16_bits} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float widened(float f) { return f; }  // for code over either element type

}  // namespace hpm::emulated
