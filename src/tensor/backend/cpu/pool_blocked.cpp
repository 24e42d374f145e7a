// The channel-blocked max pooling of pool_blocked.h, in AVX-512 intrinsics: GCC did not vectorize
// these loops over the 16 lanes of a position (a constant count of 16 is unrolled whole before
// its loop vectorizer runs; its vector extension lowered the selects lane by lane), and the
// transposes between a block's 16 channels and 16 NCHW planes are register shuffles.
#include "pool_blocked.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "parallel.h"

#define HPM_AVX512 __attribute__((target("avx512f")))

namespace hpm::cpu {

namespace {

constexpr std::int64_t kLanes = 16;  // channels per block of aBcd16b

HPM_AVX512 __mmask16 first_lanes(std::int64_t count) {
  return count >= kLanes ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << count) - 1u);
}

// Transposes 16 rows of 16 floats in registers: v[c] becomes column c. Unpacking 32-bit then
// 64-bit pairs transposes each 4x4 tile inside a 128-bit lane; two rounds of 128-bit shuffles put
// the tiles in place. Between a block's 16 channels and 16 NCHW planes this replaced per-lane
// gathers, which the pooling waited on.
//
// The all-lanes masked forms, because GCC 12 builds the unmasked ones from _mm512_undefined_ps,
// deliberately uninitialized, which its -Wuninitialized reports once inlined (under sanitizers).
HPM_AVX512 inline void transpose16(__m512* v) {
  constexpr __mmask16 kAll = 0xffff;
  constexpr __mmask8 kAll8 = 0xff;
  __m512 t[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_maskz_unpacklo_ps(kAll, v[2 * k], v[2 * k + 1]);
    t[2 * k + 1] = _mm512_maskz_unpackhi_ps(kAll, v[2 * k], v[2 * k + 1]);
  }
  __m512 u[4][4];  // u[k][s]: in 128-bit lane q, column 4q + s of rows 4k .. 4k + 3
  for (int k = 0; k < 4; ++k) {
    const __m512d a = _mm512_castps_pd(t[4 * k]), b = _mm512_castps_pd(t[4 * k + 2]);
    const __m512d c = _mm512_castps_pd(t[4 * k + 1]), d = _mm512_castps_pd(t[4 * k + 3]);
    u[k][0] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, a, b));
    u[k][1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, a, b));
    u[k][2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, c, d));
    u[k][3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, c, d));
  }
  constexpr int kEven = 0x88, kOdd = 0xdd;  // 128-bit lanes (0, 2 | 0, 2) and (1, 3 | 1, 3)
  for (int s = 0; s < 4; ++s) {
    const __m512 p = _mm512_maskz_shuffle_f32x4(kAll, u[0][s], u[1][s], kEven);
    const __m512 q = _mm512_maskz_shuffle_f32x4(kAll, u[0][s], u[1][s], kOdd);
    const __m512 r = _mm512_maskz_shuffle_f32x4(kAll, u[2][s], u[3][s], kEven);
    const __m512 w = _mm512_maskz_shuffle_f32x4(kAll, u[2][s], u[3][s], kOdd);
    v[s] = _mm512_maskz_shuffle_f32x4(kAll, p, r, kEven);
    v[4 + s] = _mm512_maskz_shuffle_f32x4(kAll, q, w, kEven);
    v[8 + s] = _mm512_maskz_shuffle_f32x4(kAll, p, r, kOdd);
    v[12 + s] = _mm512_maskz_shuffle_f32x4(kAll, q, w, kOdd);
  }
}

// 16 channels of one position, as f32 (bf16 widened exactly: its bits are the f32's top half).
HPM_AVX512 inline __m512 load_lanes(const float* p) { return _mm512_loadu_ps(p); }
HPM_AVX512 inline __m512 load_lanes(const std::uint16_t* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  constexpr __mmask16 kAll = 0xffff;  // the all-lanes masked forms: see transpose16
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(kAll, _mm512_maskz_cvtepu16_epi32(kAll, half), 16));
}

// One block (16 channels, lanes of them real) of an image: 16 windows of an output row at a time,
// each a vector over the channels, transposed into each channel's run of 16 and stored to its
// plane of y and argmax.
template <typename In>
HPM_AVX512 void pool_block(const In* block, std::int64_t h, std::int64_t w, std::int64_t lanes,
                           float* y, std::int32_t* argmax, std::int64_t plane) {
  const std::int64_t oh = h / 2, ow = w / 2;
  const auto wi = static_cast<int>(w);
  for (std::int64_t r = 0; r < oh; ++r) {
    const In* r0 = block + 2 * r * w * kLanes;
    const In* r1 = r0 + w * kLanes;
    for (std::int64_t j0 = 0; j0 < ow; j0 += kLanes) {
      const std::int64_t count = std::min(kLanes, ow - j0);
      __m512 m[16], i[16];
      for (std::int64_t q = 0; q < kLanes; ++q) {
        if (q >= count) {
          m[q] = i[q] = _mm512_setzero_ps();
          continue;
        }
        const std::int64_t j = j0 + q;
        const auto t = static_cast<int>(2 * r * w + 2 * j);
        __m512 best = load_lanes(r0 + 2 * j * kLanes);
        __m512i at = _mm512_set1_epi32(t);
        // Challengers in row-major order: each takes the window when larger, or NaN over a
        // number.
        const auto challenge = [&best, &at](const In* p, int index) HPM_AVX512 {
          const __m512 v = load_lanes(p);
          const __mmask16 take =
              _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) |
              (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q));
          best = _mm512_mask_mov_ps(best, take, v);
          at = _mm512_mask_mov_epi32(at, take, _mm512_set1_epi32(index));
        };
        challenge(r0 + (2 * j + 1) * kLanes, t + 1);
        challenge(r1 + 2 * j * kLanes, t + wi);
        challenge(r1 + (2 * j + 1) * kLanes, t + wi + 1);
        m[q] = best;
        i[q] = _mm512_castsi512_ps(at);
      }
      transpose16(m);
      transpose16(i);
      const __mmask16 k = first_lanes(count);
      for (std::int64_t l = 0; l < lanes; ++l) {
        const std::int64_t to = l * plane + r * ow + j0;
        _mm512_mask_storeu_ps(y + to, k, m[l]);
        _mm512_mask_storeu_epi32(argmax + to, k, _mm512_castps_si512(i[l]));
      }
    }
  }
}

// 16 channels of one position, stored as f32 or rounded to bf16 (to nearest even, NaN kept a
// quiet NaN: as f32_to_bf16 and oneDNN's reorders round), the bits of each in a 32-bit lane.
HPM_AVX512 inline __m512i lanes_as(float, __m512 v) { return _mm512_castps_si512(v); }
HPM_AVX512 inline __m512i lanes_as(std::uint16_t, __m512 v) {
  constexpr __mmask16 kAll = 0xffff;  // the all-lanes masked forms: see transpose16
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd =
      _mm512_maskz_and_epi32(kAll, _mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_maskz_srli_epi32(
      kAll, _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i quiet =
      _mm512_maskz_or_epi32(kAll, _mm512_maskz_srli_epi32(kAll, u, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet);
}
HPM_AVX512 inline void store_lanes(float* p, __m512i bits) { _mm512_storeu_si512(p, bits); }
HPM_AVX512 inline void store_lanes(std::uint16_t* p, __m512i bits) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_maskz_cvtepi32_epi16(static_cast<__mmask16>(0xffff), bits));
}

// The gradient rows (2r, 2r + 1) of one block: 16 windows at a time, each channel's run of the
// pooled gradient and winners loaded from its plane and transposed into vectors over the channels,
// each put at its winner and 0 at the other three; 0 past 2 ow (an odd width).
template <typename Out>
HPM_AVX512 void unpool_block_rows(const float* grad_y, const std::int32_t* argmax,
                                  std::int64_t lanes, std::int64_t plane, std::int64_t r,
                                  std::int64_t w, Out* out0, Out* out1) {
  const std::int64_t ow = w / 2;
  const auto wi = static_cast<int>(w);
  for (std::int64_t j0 = 0; j0 < ow; j0 += kLanes) {
    const std::int64_t count = std::min(kLanes, ow - j0);
    const __mmask16 k = first_lanes(count);
    __m512 g[16], a[16];
    for (std::int64_t l = 0; l < kLanes; ++l) {
      if (l >= lanes) {  // padding channels: no winner anywhere
        g[l] = _mm512_setzero_ps();
        a[l] = _mm512_castsi512_ps(_mm512_set1_epi32(-1));
        continue;
      }
      const std::int64_t from = l * plane + r * ow + j0;
      g[l] = _mm512_maskz_loadu_ps(k, grad_y + from);
      a[l] = _mm512_castsi512_ps(_mm512_mask_loadu_epi32(_mm512_set1_epi32(-1), k, argmax + from));
    }
    transpose16(g);
    transpose16(a);
    for (std::int64_t q = 0; q < count; ++q) {
      const std::int64_t j = j0 + q;
      const auto t = static_cast<int>(2 * r * w + 2 * j);
      const __m512i winner = _mm512_castps_si512(a[q]);
      const __m512i bits = lanes_as(Out{}, g[q]);
      const auto put = [&winner, &bits](Out* p, int index) HPM_AVX512 {
        store_lanes(p, _mm512_maskz_mov_epi32(
                           _mm512_cmpeq_epi32_mask(winner, _mm512_set1_epi32(index)), bits));
      };
      put(out0 + 2 * j * kLanes, t);
      put(out0 + (2 * j + 1) * kLanes, t + 1);
      put(out1 + 2 * j * kLanes, t + wi);
      put(out1 + (2 * j + 1) * kLanes, t + wi + 1);
    }
  }
  const std::size_t tail = static_cast<std::size_t>((w - 2 * ow) * kLanes) * sizeof(Out);
  std::memset(out0 + 2 * ow * kLanes, 0, tail);
  std::memset(out1 + 2 * ow * kLanes, 0, tail);
}

// Each row pair of a block's gradient, straight into dst.
template <typename Out>
void unpool_to_blocks(const float* grad_y, const std::int32_t* argmax, std::int64_t n,
                      std::int64_t c, std::int64_t h, std::int64_t w, Out* dst) {
  const std::int64_t blocks = (c + kLanes - 1) / kLanes, plane = (h / 2) * (w / 2);
  const std::int64_t row = w * kLanes;
  parallel_for(n * blocks, 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t nb = lo; nb < hi; ++nb) {
      const std::int64_t c0 = nb % blocks * kLanes;
      const std::int64_t first = (nb / blocks * c + c0) * plane;
      Out* out = dst + nb * h * row;
      for (std::int64_t r = 0; r < h / 2; ++r) {
        Out* pair = out + 2 * r * row;
        unpool_block_rows(grad_y + first, argmax + first, std::min(kLanes, c - c0), plane, r, w,
                          pair, pair + row);
      }
      if (h % 2 != 0) {
        Out* last = out + (h - 1) * row;
        std::fill(last, last + row, Out{0});
      }
    }
  });
}

}  // namespace

bool channel_block_pooling_available() {
  static const bool on = __builtin_cpu_supports("avx512f");
  return on;
}

namespace {

template <typename In>
void pool_blocks(const In* src, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                 float* y, std::int32_t* argmax) {
  const std::int64_t blocks = (c + kLanes - 1) / kLanes, plane = (h / 2) * (w / 2);
  parallel_for(n * blocks, 1, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t nb = lo; nb < hi; ++nb) {
      const std::int64_t c0 = nb % blocks * kLanes;
      const std::int64_t first = (nb / blocks * c + c0) * plane;
      pool_block(src + nb * h * w * kLanes, h, w, std::min(kLanes, c - c0), y + first,
                 argmax + first, plane);
    }
  });
}

}  // namespace

void max_pool_2x2_from_channel_blocks(const float* src, std::int64_t n, std::int64_t c,
                                      std::int64_t h, std::int64_t w, float* y,
                                      std::int32_t* argmax) {
  pool_blocks(src, n, c, h, w, y, argmax);
}

void max_pool_2x2_from_channel_blocks_bf16(const std::uint16_t* src, std::int64_t n, std::int64_t c,
                                           std::int64_t h, std::int64_t w, float* y,
                                           std::int32_t* argmax) {
  pool_blocks(src, n, c, h, w, y, argmax);
}

void max_unpool_2x2_to_channel_blocks(const float* grad_y, const std::int32_t* argmax,
                                      std::int64_t n, std::int64_t c, std::int64_t h,
                                      std::int64_t w, float* dst) {
  unpool_to_blocks(grad_y, argmax, n, c, h, w, dst);
}

void max_unpool_2x2_to_channel_blocks_bf16(const float* grad_y, const std::int32_t* argmax,
                                           std::int64_t n, std::int64_t c, std::int64_t h,
                                           std::int64_t w, std::uint16_t* dst) {
  unpool_to_blocks(grad_y, argmax, n, c, h, w, dst);
}

}  // namespace hpm::cpu
