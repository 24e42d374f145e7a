// to_bf16 of many tensors in one launch (to_bf16_many: autocast's bf16 copies of a model's
// weights, 73 launches a GPT-2 small step one by one, 1.07 ms of its 44 in run 9's profile; run
// 10 measured the one launch at 0.25 ms), apart from the launcher (elementwise.cu) so that
// tests/cuda_emulated can compile it for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <cstdint>

#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/tensor_lists.h"

namespace hpm::cuda {

namespace {

constexpr int kCastList = 64;
constexpr std::int64_t kCastChunk = 8192;  // elements a block converts: 256 threads, 4 x 8 each
struct CastList {
  const float* x[kCastList];
  std::uint16_t* y[kCastList];
  std::int64_t n[kCastList];
  int first_block[kCastList + 1];
  int count;
};
static_assert(sizeof(CastList) < 2000, "CastList must fit a kernel argument");

// Packs the tensors into CastLists as the launcher walks them (tensor_lists.h).
class CastPacker {
 public:
  template <typename Launch>
  void add(const float* x, std::uint16_t* y, std::int64_t n, Launch&& launch) {
    packer_.add(
        n,
        [&](CastList& l, int t) {
          l.x[t] = x;
          l.y[t] = y;
        },
        launch);
  }
  template <typename Launch>
  void flush(Launch&& launch) {
    packer_.flush(launch);
  }

 private:
  TensorListPacker<CastList, kCastList, kCastChunk> packer_;
};

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

// Block b converts chunk b - first_block[t] of tensor t (the t whose blocks b falls in), rounded
// as f32_to_bf16_kernel rounds (the same bits as to_bf16): 16-byte loads and stores where both
// tensors are 16-byte aligned (a chunk starts a multiple of 8192 elements in), else one by one.
__global__ void f32_to_bf16_many_kernel(CastList l) {
  const int b = static_cast<int>(blockIdx.x);
  int t = 0;
  while (t + 1 < l.count && l.first_block[t + 1] <= b) ++t;
  const std::int64_t begin = static_cast<std::int64_t>(b - l.first_block[t]) * kCastChunk;
  const std::int64_t end = begin + kCastChunk < l.n[t] ? begin + kCastChunk : l.n[t];
  const float* x = l.x[t];
  std::uint16_t* y = l.y[t];
  std::int64_t scalar_from = begin;
  if (aligned16(x) && aligned16(y)) {
    const std::int64_t groups = (end - begin) / 8;
    for (std::int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      float v[8];
      load8(x + begin + 8 * g, v);
      store8(y + begin + 8 * g, v);
    }
    scalar_from = begin + 8 * groups;
  }
  for (std::int64_t i = scalar_from + threadIdx.x; i < end; i += blockDim.x) {
    y[i] = f32_to_bf16_bits(x[i]);
  }
}

#endif

}  // namespace

}  // namespace hpm::cuda
