// Fused scaled dot-product attention, softmax(scale q k^T [causal mask]) v, FlashAttention's way:
// the T x S score matrix never exists. The semantics are attention.cpp's (F32) and
// attention_bf16.cpp's (BF16 q, k, v).
//
// Legend as there: B = batch (every leading dimension, heads included), T queries, S keys/values,
// D head size. Causal masking is top-left aligned: query i sees keys j <= i (also when T != S).
//
// Forward: a warp per query row, kWarps rows a block. The block stages kTile keys (and values) at a
// time in shared memory; lane j scores key j0 + j against the warp's query, and the warp keeps an
// online softmax (running max m and sum l, its accumulator rescaled when m grows). Each lane owns
// the output columns lane, lane + 32, ... (kPer of them, so D <= 32 kPer) in registers. F32 saves
// out = acc / l and lse = m + log(l). BF16 rounds the probabilities to bf16 before P V, as the CPU
// does after normalizing them, so it runs two passes over the keys: the first finds m and l, the
// second accumulates round(exp(s - m) / l) v. An all-masked row (lse -inf) gives zeros.
//
// Backward: Delta = rowsum(dO * O) first; then with P = exp(scale q k - lse) recomputed,
// dS = P (dO v - Delta):
//   dq_i = scale sum_j dS_ij k_j      a warp per query row, looping over the keys it sees;
//   dk_j = scale sum_i dS_ij q_i,
//   dv_j = sum_i P_ij dO_i            a warp per key row, looping over the queries that see it.
// Each gradient row has one owner, so no atomics; every sum runs in a fixed order. BF16: dO, and P
// (for dv) and dS (for dq, dk), are rounded to bf16 for the products, as attention_bf16.cpp's.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "tensor/backend/cuda/attention_mma.h"
#include "tensor/backend/cuda/attention_tiled.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr int kWarps = 8;  // rows (queries or keys) a block owns, a warp each
constexpr int kThreads = kWarps * 32;
constexpr int kTile = 32;   // keys (or queries) staged at a time: one per lane
constexpr int kMaxPer = 8;  // output columns a lane owns at most: D <= 256
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using Bf16Bits = std::uint16_t;  // BF16 tensors hold the upper halves of floats

template <typename In>
constexpr bool kIsBf16 = std::is_same_v<In, Bf16Bits>;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(Bf16Bits x) {
  return __uint_as_float(static_cast<unsigned>(x) << 16);
}
// A float rounded to bf16 (nearest, ties to even), as a float.
__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ std::int64_t min64(std::int64_t a, std::int64_t b) {
  return a < b ? a : b;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Rows [0, rows) of a row-major (., d) matrix at src into shared memory, rows `stride` floats
// apart, rounded to bf16 when asked (dO under bf16). Every thread of the block takes part.
template <typename In>
__device__ void stage_rows(float* dst, int stride, const In* __restrict__ src, int rows, int d,
                           bool round) {
  const int total = rows * d;
  for (int e = static_cast<int>(threadIdx.x); e < total; e += static_cast<int>(blockDim.x)) {
    const int r = e / d, c = e - r * d;
    const float x = to_float(src[static_cast<std::int64_t>(e)]);
    dst[r * stride + c] = round ? round_bf16(x) : x;
  }
}

// sum_c a[c] b[c] in order (f32 accumulation, as the CPU's products).
__device__ __forceinline__ float dot(const float* a, const float* b, int d) {
  float acc = 0.0f;
#pragma unroll 4
  for (int c = 0; c < d; ++c) acc = fmaf(a[c], b[c], acc);
  return acc;
}

// Rows of a staged key/query tile are read one per lane across the row: an odd stride puts the
// 32 lanes' elements in 32 different banks.
__host__ __device__ constexpr int padded(int d) { return d | 1; }

// ---- forward ------------------------------------------------------------------------------------

template <typename In, int kPer>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const In* __restrict__ q, const In* __restrict__ k,
                             const In* __restrict__ v, float* __restrict__ out,
                             float* __restrict__ lse, std::int64_t t, std::int64_t s, int d,
                             bool causal, float scale) {
  constexpr bool kTwoPass = kIsBf16<In>;
  extern __shared__ float smem[];
  const int ks = padded(d);
  float* k_s = smem;              // kTile keys, rows ks apart
  float* v_s = k_s + kTile * ks;  // kTile values, rows d apart (read across a row)
  float* q_s = v_s + kTile * d;   // the block's kWarps queries
  const std::int64_t row_blocks = (t + kWarps - 1) / kWarps;
  const std::int64_t b = blockIdx.x / row_blocks, i0 = (blockIdx.x % row_blocks) * kWarps;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t i = i0 + warp;
  const bool active = i < t;
  stage_rows(q_s, d, q + (b * t + i0) * d, static_cast<int>(min64(kWarps, t - i0)), d,
             false);  // read only after the first tile's barrier
  // Keys some row of the block sees (block-uniform, so every thread meets every barrier), and
  // those this row sees.
  const std::int64_t end = causal ? min64(s, i0 + kWarps) : s;
  const std::int64_t visible = causal ? min64(s, i + 1) : s;
  const float* q_row = q_s + warp * d;
  float m = kNegInf, l = 0.0f, inv_l = 0.0f;
  float acc[kPer];
#pragma unroll
  for (int x = 0; x < kPer; ++x) acc[x] = 0.0f;
  for (int pass = kTwoPass ? 0 : 1; pass < 2; ++pass) {
    const bool accumulate = pass == 1;  // the two-pass form's first pass only finds m and l
    if (kTwoPass && accumulate) inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    for (std::int64_t j0 = 0; j0 < end; j0 += kTile) {
      const int jn = static_cast<int>(min64(kTile, end - j0));
      __syncthreads();  // the previous tile is consumed
      stage_rows(k_s, ks, k + (b * s + j0) * d, jn, d, false);
      if (accumulate) stage_rows(v_s, d, v + (b * s + j0) * d, jn, d, false);
      __syncthreads();
      if (!active || j0 >= visible) continue;  // warp-uniform
      float score = kNegInf;
      if (lane < jn && j0 + lane < visible) score = dot(q_row, k_s + lane * ks, d) * scale;
      float p;
      if (!kTwoPass) {
        const float mx = fmaxf(m, warp_max(score));
        // A row that has seen only masked keys keeps m = -inf and adds nothing.
        const float shift = mx == kNegInf ? 0.0f : mx;
        p = expf(score - shift);
        const float rescale = expf(m - shift);
        l = l * rescale + warp_sum(p);
        m = mx;
#pragma unroll
        for (int x = 0; x < kPer; ++x) acc[x] *= rescale;
      } else if (!accumulate) {
        const float mx = fmaxf(m, warp_max(score));
        const float shift = mx == kNegInf ? 0.0f : mx;
        const float sum = warp_sum(expf(score - shift));
        l = l * expf(m - shift) + sum;
        m = mx;
        continue;
      } else {
        // The final m and l: the normalized probability, rounded for the bf16 product.
        p = round_bf16(expf(score - (m == kNegInf ? 0.0f : m)) * inv_l);
      }
      for (int jj = 0; jj < jn; ++jj) {
        const float pj = __shfl_sync(kFullMask, p, jj);
        const float* v_row = v_s + jj * d;
#pragma unroll
        for (int x = 0; x < kPer; ++x) {
          const int c = lane + 32 * x;
          if (c < d) acc[x] = fmaf(pj, v_row[c], acc[x]);
        }
      }
    }
  }
  if (!active) return;
  const float inv = kTwoPass ? 1.0f : (l > 0.0f ? 1.0f / l : 0.0f);
  float* o = out + (b * t + i) * d;
#pragma unroll
  for (int x = 0; x < kPer; ++x) {
    const int c = lane + 32 * x;
    if (c < d) o[c] = acc[x] * inv;
  }
  if (lane == 0) lse[b * t + i] = l > 0.0f ? m + logf(l) : kNegInf;
}

// ---- backward -----------------------------------------------------------------------------------

// delta[r] = sum_c g[r, c] o[r, c], a warp per row; o F32 or BF16 (O float or its bits: the copy
// autocast kept).
template <typename O>
__global__ void row_dots_kernel(const float* __restrict__ g, const O* __restrict__ o,
                                float* __restrict__ delta, std::int64_t rows, std::int64_t d) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t warps = blockDim.x >> 5;
  for (std::int64_t r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * warps) {
    float acc = 0.0f;
    for (std::int64_t c = lane; c < d; c += 32) acc = fmaf(g[r * d + c], as_f32(o[r * d + c]), acc);
    acc = warp_sum(acc);
    if (lane == 0) delta[r] = acc;
  }
}

// dq: a warp per query row; keys staged kTile at a time (K and V tiles, rows padded: lane j reads
// key j's row for both dot products).
template <typename In, int kPer>
__global__ void __launch_bounds__(kThreads)
    attention_grad_q_kernel(const In* __restrict__ q, const In* __restrict__ k,
                            const In* __restrict__ v, const float* __restrict__ g,
                            const float* __restrict__ lse, const float* __restrict__ delta,
                            float* __restrict__ gq, std::int64_t t, std::int64_t s, int d,
                            bool causal, float scale) {
  constexpr bool kBf16 = kIsBf16<In>;
  extern __shared__ float smem[];
  const int ks = padded(d);
  float* k_s = smem;
  float* v_s = k_s + kTile * ks;
  float* q_s = v_s + kTile * ks;
  float* g_s = q_s + kWarps * d;
  const std::int64_t row_blocks = (t + kWarps - 1) / kWarps;
  const std::int64_t b = blockIdx.x / row_blocks, i0 = (blockIdx.x % row_blocks) * kWarps;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t i = i0 + warp;
  const bool active = i < t;
  const int rows = static_cast<int>(min64(kWarps, t - i0));
  stage_rows(q_s, d, q + (b * t + i0) * d, rows, d, false);
  stage_rows(g_s, d, g + (b * t + i0) * d, rows, d, kBf16);
  const std::int64_t end = causal ? min64(s, i0 + kWarps) : s;
  const std::int64_t visible = causal ? min64(s, i + 1) : s;
  const float row_lse = active ? lse[b * t + i] : 0.0f;
  const float row_delta = active ? delta[b * t + i] : 0.0f;
  const float* q_row = q_s + warp * d;
  const float* g_row = g_s + warp * d;
  float acc[kPer];
#pragma unroll
  for (int x = 0; x < kPer; ++x) acc[x] = 0.0f;
  for (std::int64_t j0 = 0; j0 < end; j0 += kTile) {
    const int jn = static_cast<int>(min64(kTile, end - j0));
    __syncthreads();
    stage_rows(k_s, ks, k + (b * s + j0) * d, jn, d, false);
    stage_rows(v_s, ks, v + (b * s + j0) * d, jn, d, false);
    __syncthreads();
    if (!active || j0 >= visible) continue;
    float ds = 0.0f;  // masked keys get no gradient
    if (lane < jn && j0 + lane < visible) {
      const float p =
          row_lse == kNegInf ? 0.0f : expf(dot(q_row, k_s + lane * ks, d) * scale - row_lse);
      ds = p * (dot(g_row, v_s + lane * ks, d) - row_delta);
      if (kBf16) ds = round_bf16(ds);
    }
    for (int jj = 0; jj < jn; ++jj) {
      const float dsj = __shfl_sync(kFullMask, ds, jj);
      const float* k_row = k_s + jj * ks;
#pragma unroll
      for (int x = 0; x < kPer; ++x) {
        const int c = lane + 32 * x;
        if (c < d) acc[x] = fmaf(dsj, k_row[c], acc[x]);
      }
    }
  }
  if (!active) return;
  float* out = gq + (b * t + i) * d;
#pragma unroll
  for (int x = 0; x < kPer; ++x) {
    const int c = lane + 32 * x;
    if (c < d) out[c] = acc[x] * scale;
  }
}

// dk, dv: a warp per key row; the queries that see the block's keys staged kTile at a time (Q and
// dO tiles, rows padded, with their lse and Delta).
template <typename In, int kPer>
__global__ void __launch_bounds__(kThreads)
    attention_grad_kv_kernel(const In* __restrict__ q, const In* __restrict__ k,
                             const In* __restrict__ v, const float* __restrict__ g,
                             const float* __restrict__ lse, const float* __restrict__ delta,
                             float* __restrict__ gk, float* __restrict__ gv, std::int64_t t,
                             std::int64_t s, int d, bool causal, float scale) {
  constexpr bool kBf16 = kIsBf16<In>;
  extern __shared__ float smem[];
  const int ks = padded(d);
  float* q_s = smem;
  float* g_s = q_s + kTile * ks;
  float* k_s = g_s + kTile * ks;  // the block's kWarps keys
  float* v_s = k_s + kWarps * d;
  float* lse_s = v_s + kWarps * d;  // kTile
  float* delta_s = lse_s + kTile;   // kTile
  const std::int64_t key_blocks = (s + kWarps - 1) / kWarps;
  const std::int64_t b = blockIdx.x / key_blocks, j0 = (blockIdx.x % key_blocks) * kWarps;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const std::int64_t j = j0 + warp;
  const bool active = j < s;
  const int keys = static_cast<int>(min64(kWarps, s - j0));
  stage_rows(k_s, d, k + (b * s + j0) * d, keys, d, false);
  stage_rows(v_s, d, v + (b * s + j0) * d, keys, d, false);
  const float* k_row = k_s + warp * d;
  const float* v_row = v_s + warp * d;
  float dk[kPer], dv[kPer];
#pragma unroll
  for (int x = 0; x < kPer; ++x) dk[x] = dv[x] = 0.0f;
  // Causal: queries before the block's first key see none of its keys.
  for (std::int64_t i0 = causal ? j0 : 0; i0 < t; i0 += kTile) {
    const int in = static_cast<int>(min64(kTile, t - i0));
    __syncthreads();
    stage_rows(q_s, ks, q + (b * t + i0) * d, in, d, false);
    stage_rows(g_s, ks, g + (b * t + i0) * d, in, d, kBf16);
    if (threadIdx.x < static_cast<unsigned>(in)) {
      lse_s[threadIdx.x] = lse[b * t + i0 + threadIdx.x];
      delta_s[threadIdx.x] = delta[b * t + i0 + threadIdx.x];
    }
    __syncthreads();
    if (!active || (causal && i0 + in <= j)) continue;  // no query of the tile sees key j
    float p = 0.0f, ds = 0.0f;
    if (lane < in && (!causal || i0 + lane >= j)) {
      const float row_lse = lse_s[lane];
      p = row_lse == kNegInf ? 0.0f : expf(dot(q_s + lane * ks, k_row, d) * scale - row_lse);
      ds = p * (dot(g_s + lane * ks, v_row, d) - delta_s[lane]);
      if (kBf16) {
        p = round_bf16(p);
        ds = round_bf16(ds);
      }
    }
    for (int ii = 0; ii < in; ++ii) {
      const float pi = __shfl_sync(kFullMask, p, ii);
      const float dsi = __shfl_sync(kFullMask, ds, ii);
      const float* q_row = q_s + ii * ks;
      const float* g_row = g_s + ii * ks;
#pragma unroll
      for (int x = 0; x < kPer; ++x) {
        const int c = lane + 32 * x;
        if (c < d) {
          dv[x] = fmaf(pi, g_row[c], dv[x]);
          dk[x] = fmaf(dsi, q_row[c], dk[x]);
        }
      }
    }
  }
  if (!active) return;
  float* out_k = gk + (b * s + j) * d;
  float* out_v = gv + (b * s + j) * d;
#pragma unroll
  for (int x = 0; x < kPer; ++x) {
    const int c = lane + 32 * x;
    if (c < d) {
      out_k[c] = dk[x] * scale;
      out_v[c] = dv[x];
    }
  }
}

// ---- host side ----------------------------------------------------------------------------------

struct Dims {
  std::int64_t batch, t, s, d;
};

// attention.cpp's attention_dims: the same checks and message.
Dims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, DType dtype,
                    const char* what) {
  const auto same_batch = [](const Tensor& a, const Tensor& b) {
    if (a.dim() != b.dim()) return false;
    for (int i = 0; i < a.dim() - 2; ++i)
      if (a.size(i) != b.size(i)) return false;
    return true;
  };
  if (q.dim() < 3 || !same_batch(q, k) || !same_batch(q, v) || k.shape() != v.shape() ||
      q.size(-1) != k.size(-1) || q.dtype() != dtype || k.dtype() != dtype || v.dtype() != dtype) {
    throw std::invalid_argument(std::string(what) + ": expected " + dtype_name(dtype) +
                                " q (..., T, D), k and v (..., S, D) with the same leading "
                                "dimensions, got " +
                                q.shape().str() + ", " + k.shape().str() + ", " + v.shape().str());
  }
  std::int64_t batch = 1;
  for (int i = 0; i < q.dim() - 2; ++i) batch *= q.size(i);
  if (q.size(-1) > 32 * kMaxPer) {
    throw std::invalid_argument(std::string(what) + " on CUDA: head size " +
                                std::to_string(q.size(-1)) + " above " +
                                std::to_string(32 * kMaxPer) + " is not supported");
  }
  return {batch, q.size(-2), k.size(-2), q.size(-1)};
}

// Calls f with std::integral_constant<int, kPer>: the columns a lane owns for head size d.
template <typename F>
void with_per(std::int64_t d, F&& f) {
  if (d <= 32) {
    f(std::integral_constant<int, 1>{});
  } else if (d <= 64) {
    f(std::integral_constant<int, 2>{});
  } else if (d <= 128) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, kMaxPer>{});
  }
}

unsigned row_block_grid(std::int64_t batch, std::int64_t rows) {
  return row_blocks(batch, rows, kWarps);
}

template <typename In>
void forward(const Dims& n, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
             float scale, Tensor& out, Tensor& lse) {
  const int d = static_cast<int>(n.d);
  const std::size_t smem =
      sizeof(float) * static_cast<std::size_t>(kTile * padded(d) + kTile * d + kWarps * d);
  with_per(n.d, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    auto* kernel = attention_forward_kernel<In, kPer>;
    allow_dynamic_smem(kernel, smem);
    kernel<<<row_block_grid(n.batch, n.t), kThreads, smem, current_stream()>>>(
        ptr<In>(q), ptr<In>(k), ptr<In>(v), ptr<float>(out), ptr<float>(lse), n.t, n.s, d, causal,
        scale);
    HPM_CUDA_LAUNCH_CHECK("attention_forward_kernel");
  });
}

template <typename In>
void backward(const Dims& n, const Tensor& grad_out, const Tensor& q, const Tensor& k,
              const Tensor& v, const Tensor& out, const Tensor& lse, bool causal, float scale,
              Tensor* grad_q, Tensor* grad_k, Tensor* grad_v) {
  const bool want_q = grad_q != nullptr, want_kv = grad_k != nullptr || grad_v != nullptr;
  Tensor gq, gk, gv;
  if (want_q) gq = Tensor::empty(q.shape(), DType::F32);
  if (want_kv) {
    gk = Tensor::empty(k.shape(), DType::F32);
    gv = Tensor::empty(v.shape(), DType::F32);
  }
  cudaStream_t stream = current_stream();
  const std::int64_t rows = n.batch * n.t;
  const int d = static_cast<int>(n.d);
  // Delta = rowsum(dO * O), in f32 from the unrounded dO (as both CPU paths): by the mma path's
  // own kernel (which also rounds dO for its products), else here.
  Tensor delta = Tensor::empty({rows > 0 ? rows : 1}, DType::F32);
  if constexpr (kIsBf16<In>) {
    if (mma_attention_applies(n.d, ptr<In>(q), ptr<In>(k), ptr<In>(v))) {
      const AttentionLayout layout = contiguous_attention(d);
      Tensor grad_out_bf16 = Tensor::empty(grad_out.shape(), DType::BF16);
      mma_attention_delta(ptr<float>(grad_out), /*grad_bf16=*/false, device_ptr(out),
                          out.dtype() == DType::BF16, ptr<float>(delta),
                          ptr<std::uint16_t>(grad_out_bf16), n.batch, n.t, d, layout, stream);
      // The one pass's scratch, where it runs (all three gradients wanted, not switched off).
      const std::int64_t scratch_elements =
          want_q && want_kv ? mma_attention_scratch_elements(n.batch, n.t, d) : 0;
      const Tensor scratch =
          scratch_elements > 0 ? Tensor::empty({scratch_elements}, DType::F32) : Tensor();
      mma_attention_backward(ptr<In>(q), ptr<In>(k), ptr<In>(v), ptr<std::uint16_t>(grad_out_bf16),
                             ptr<float>(lse), ptr<float>(delta), want_q ? device_ptr(gq) : nullptr,
                             want_kv ? device_ptr(gk) : nullptr, want_kv ? device_ptr(gv) : nullptr,
                             /*grad_bf16=*/false, n.batch, n.t, n.s, d, causal, scale, layout,
                             stream, scratch.defined() ? device_ptr(scratch) : nullptr);
      if (grad_q != nullptr) *grad_q = gq;
      if (grad_k != nullptr) *grad_k = gk;
      if (grad_v != nullptr) *grad_v = gv;
      return;
    }
  }
  if (rows > 0 && out.dtype() == DType::BF16) {
    row_dots_kernel<<<blocks_for(rows, kWarps), kThreads, 0, stream>>>(
        ptr<float>(grad_out), ptr<std::uint16_t>(out), ptr<float>(delta), rows, n.d);
    HPM_CUDA_LAUNCH_CHECK("row_dots_kernel");
  } else if (rows > 0) {
    row_dots_kernel<<<blocks_for(rows, kWarps), kThreads, 0, stream>>>(
        ptr<float>(grad_out), ptr<float>(out), ptr<float>(delta), rows, n.d);
    HPM_CUDA_LAUNCH_CHECK("row_dots_kernel");
  }
  if constexpr (kIsBf16<In>) {
    if (tiled_attention_applies(n.d, ptr<In>(q), ptr<In>(k), ptr<In>(v), ptr<float>(grad_out))) {
      tiled_attention_backward(
          ptr<In>(q), ptr<In>(k), ptr<In>(v), ptr<float>(grad_out), ptr<float>(lse),
          ptr<float>(delta), want_q ? ptr<float>(gq) : nullptr, want_kv ? ptr<float>(gk) : nullptr,
          want_kv ? ptr<float>(gv) : nullptr, n.batch, n.t, n.s, d, causal, scale, stream);
      if (grad_q != nullptr) *grad_q = gq;
      if (grad_k != nullptr) *grad_k = gk;
      if (grad_v != nullptr) *grad_v = gv;
      return;
    }
  }
  const int ks = padded(d);
  with_per(n.d, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    if (want_q && rows > 0) {
      const std::size_t smem =
          sizeof(float) * static_cast<std::size_t>(2 * kTile * ks + 2 * kWarps * d);
      auto* kernel = attention_grad_q_kernel<In, kPer>;
      allow_dynamic_smem(kernel, smem);
      kernel<<<row_block_grid(n.batch, n.t), kThreads, smem, stream>>>(
          ptr<In>(q), ptr<In>(k), ptr<In>(v), ptr<float>(grad_out), ptr<float>(lse),
          ptr<float>(delta), ptr<float>(gq), n.t, n.s, d, causal, scale);
      HPM_CUDA_LAUNCH_CHECK("attention_grad_q_kernel");
    }
    if (want_kv && n.batch * n.s > 0) {
      const std::size_t smem =
          sizeof(float) * static_cast<std::size_t>(2 * kTile * ks + 2 * kWarps * d + 2 * kTile);
      auto* kernel = attention_grad_kv_kernel<In, kPer>;
      allow_dynamic_smem(kernel, smem);
      kernel<<<row_block_grid(n.batch, n.s), kThreads, smem, stream>>>(
          ptr<In>(q), ptr<In>(k), ptr<In>(v), ptr<float>(grad_out), ptr<float>(lse),
          ptr<float>(delta), ptr<float>(gk), ptr<float>(gv), n.t, n.s, d, causal, scale);
      HPM_CUDA_LAUNCH_CHECK("attention_grad_kv_kernel");
    }
  });
  if (grad_q != nullptr) *grad_q = gq;
  if (grad_k != nullptr) *grad_k = gk;
  if (grad_v != nullptr) *grad_v = gv;
}

}  // namespace

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& lse) {
  // As cpu_backend.cpp: BF16 q picks the bf16 semantics (and then k, v must be BF16 too).
  const bool bf16 = q.dtype() == DType::BF16;
  const Dims n = attention_dims(q, k, v, bf16 ? DType::BF16 : DType::F32,
                                bf16 ? "attention (bf16)" : "attention");
  Tensor out = Tensor::empty(q.shape(), DType::F32);
  std::vector<std::int64_t> lse_dims(q.shape().dims().begin(), q.shape().dims().end() - 1);
  lse = Tensor::empty(Shape(lse_dims), DType::F32);
  if (n.batch * n.t == 0) return out;
  // S == 0 needs no special case: no tile runs, so out is 0 and lse -inf (the CPU's).
  if (bf16 && tiled_attention_applies(n.d, ptr<Bf16Bits>(q), ptr<Bf16Bits>(k), ptr<Bf16Bits>(v)) &&
      (attention_kernels() == AttentionKernels::kWmma || mma_forward_takes(scale))) {
    const int d = static_cast<int>(n.d);
    if (attention_kernels() == AttentionKernels::kWmma) {
      tiled_attention_forward(ptr<Bf16Bits>(q), ptr<Bf16Bits>(k), ptr<Bf16Bits>(v), ptr<float>(out),
                              ptr<float>(lse), n.batch, n.t, n.s, d, causal, scale,
                              current_stream());
    } else {
      mma_attention_forward(ptr<Bf16Bits>(q), ptr<Bf16Bits>(k), ptr<Bf16Bits>(v), ptr<float>(out),
                            /*out_bf16=*/false, ptr<float>(lse), n.batch, n.t, n.s, d, causal,
                            scale, contiguous_attention(d), current_stream());
    }
  } else if (bf16) {
    forward<Bf16Bits>(n, q, k, v, causal, scale, out, lse);
  } else {
    forward<float>(n, q, k, v, causal, scale, out, lse);
  }
  return out;
}

void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, float scale,
                        Tensor* grad_q, Tensor* grad_k, Tensor* grad_v) {
  const bool bf16 = q.dtype() == DType::BF16;
  const Dims n = attention_dims(q, k, v, bf16 ? DType::BF16 : DType::F32,
                                bf16 ? "attention (bf16)" : "attention");
  check_shape(grad_out, q.shape(),
              bf16 ? "attention backward (bf16): grad_out" : "attention backward: grad_out");
  // The CPU's f32 path reads out and lse unchecked; here a mismatch is an error, not a stray read.
  check_shape(out, q.shape(), bf16 ? "attention backward (bf16): out" : "attention backward: out");
  require_dtype(grad_out, DType::F32);
  if (out.dtype() != DType::BF16) require_dtype(out, DType::F32);
  require_dtype(lse, DType::F32);
  if (lse.numel() != n.batch * n.t) {
    throw std::invalid_argument("attention backward: lse of " + lse.shape().str() + " for " +
                                q.shape().str() + " queries");
  }
  if (bf16) {
    backward<Bf16Bits>(n, grad_out, q, k, v, out, lse, causal, scale, grad_q, grad_k, grad_v);
  } else {
    backward<float>(n, grad_out, q, k, v, out, lse, causal, scale, grad_q, grad_k, grad_v);
  }
}

}  // namespace hpm::cuda
