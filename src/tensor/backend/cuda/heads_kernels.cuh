// The attention heads' layout kernels of layout.cu (split_heads, split_qkv_heads, merge_heads and
// their bf16 forms: cpu/heads_layout.cpp's element moves), apart from the launchers so that
// tests/cuda_emulated can compile them for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "tensor/backend/cuda/kernel_support.h"

namespace hpm::cuda {

namespace {

struct HeadsLayout {
  std::int64_t batch, t, heads, d;
};

template <typename Head>
struct HeadPtrs {
  Head* p[3];
};

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

// Element i of the packed (B, T, parts, H, D) tensor <-> element (b, h, t, dd) of head tensor
// `part` (B, H, T, D). One thread per packed element: the packed side is read or written
// contiguously, the head side in D-long contiguous runs.
__device__ inline std::int64_t head_index(std::int64_t i, const HeadsLayout& l, std::int64_t parts,
                                          std::int64_t& part) {
  const std::int64_t dd = i % l.d;
  std::int64_t q = i / l.d;
  const std::int64_t h = q % l.heads;
  q /= l.heads;
  part = q % parts;
  const std::int64_t row = q / parts;  // b * T + t
  const std::int64_t b = row / l.t, t = row % l.t;
  return ((b * l.heads + h) * l.t + t) * l.d + dd;
}

// Packed float (rounded to bf16 heads when Head is std::uint16_t), or std::uint16_t bf16 bits
// moved to bf16 heads.
template <typename Head, typename Packed = float>
__global__ void to_heads_kernel(const Packed* packed, HeadPtrs<Head> heads, HeadsLayout l,
                                std::int64_t parts, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t part;
    const std::int64_t hi = head_index(i, l, parts, part);
    if constexpr (sizeof(Packed) == 2) {
      heads.p[part][hi] = packed[i];  // bf16 bits to bf16 heads
    } else if constexpr (sizeof(Head) == 2) {
      heads.p[part][hi] = f32_to_bf16_bits(packed[i]);
    } else {
      heads.p[part][hi] = packed[i];
    }
  }
}

// Out float, or std::uint16_t for the packed tensor rounded to bf16.
template <typename Out>
__global__ void to_packed_kernel(Out* packed, HeadPtrs<const float> heads, HeadsLayout l,
                                 std::int64_t parts, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t part;
    const std::int64_t hi = head_index(i, l, parts, part);
    if constexpr (sizeof(Out) == 2) {
      packed[i] = f32_to_bf16_bits(heads.p[part][hi]);
    } else {
      packed[i] = heads.p[part][hi];
    }
  }
}

// merge_heads rounded to bf16 (packed), the heads rounded too into heads_bf16 when given.
__global__ void to_packed_bf16_kernel(std::uint16_t* packed, const float* heads,
                                      std::uint16_t* heads_bf16, HeadsLayout l, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t part;
    const std::int64_t hi = head_index(i, l, 1, part);
    const std::uint16_t b = f32_to_bf16_bits(heads[hi]);
    packed[i] = b;
    if (heads_bf16 != nullptr) heads_bf16[hi] = b;
  }
}

#endif

}  // namespace

}  // namespace hpm::cuda
