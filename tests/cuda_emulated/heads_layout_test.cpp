// layout.cu's attention-heads kernels (heads_kernels.cuh: a packed (B, T, parts x H x D) tensor to
// (B, H, T, D) heads and back, in f32 and the bf16 forms), compiled for the CPU and run under
// simt.h's emulation as layout.cu launches them, against the CPU's split and merge ops bit for bit
// (they move and round elements; nothing is summed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/heads_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;

constexpr int kThreads = 256;
constexpr unsigned kBlocks = 4;  // fewer threads than elements: the grid-stride loops go round

template <typename T>
std::vector<T> sized(const Tensor& like) {
  return std::vector<T>(static_cast<std::size_t>(like.numel()));
}

void check_layout(std::int64_t b, std::int64_t t, std::int64_t heads, std::int64_t d) {
  SCOPED_TRACE("B " + std::to_string(b) + " T " + std::to_string(t) + " H " +
               std::to_string(heads) + " D " + std::to_string(d));
  Generator gen(static_cast<std::uint64_t>(b * 1000 + t * 10 + d));
  const cuda::HeadsLayout l{b, t, heads, d};
  const std::int64_t n3 = b * t * 3 * heads * d, n1 = b * t * heads * d;
  const Tensor qkv = Tensor::randn({b, t, 3 * heads * d}, gen);
  const std::vector<float> qkv_v = copy_of<float>(qkv);

  // split_qkv_heads: f32 heads, bf16 heads rounded on the way, bf16 heads from a bf16 qkv.
  Tensor q, k, v;
  kernels::split_qkv_heads(qkv, heads, DType::F32, q, k, v);
  std::vector<float> hq = sized<float>(q), hk = sized<float>(q), hv = sized<float>(q);
  const cuda::HeadPtrs<float> out{{hq.data(), hk.data(), hv.data()}};
  simt::launch(kBlocks, kThreads, 0, [&] { cuda::to_heads_kernel(qkv_v.data(), out, l, 3, n3); });
  EXPECT_EQ(hq, copy_of<float>(q));
  EXPECT_EQ(hk, copy_of<float>(k));
  EXPECT_EQ(hv, copy_of<float>(v));

  Tensor qb, kb, vb;
  kernels::split_qkv_heads(qkv, heads, DType::BF16, qb, kb, vb);
  std::vector<std::uint16_t> bq = sized<std::uint16_t>(q), bk = bq, bv = bq;
  const cuda::HeadPtrs<std::uint16_t> out_b{{bq.data(), bk.data(), bv.data()}};
  simt::launch(kBlocks, kThreads, 0,
               [&] { cuda::to_heads_kernel<std::uint16_t>(qkv_v.data(), out_b, l, 3, n3); });
  EXPECT_EQ(bq, copy_of<std::uint16_t>(qb));
  EXPECT_EQ(bk, copy_of<std::uint16_t>(kb));
  EXPECT_EQ(bv, copy_of<std::uint16_t>(vb));

  const Tensor qkv_b = kernels::to_bf16(qkv);
  const std::vector<std::uint16_t> qkv_bv = copy_of<std::uint16_t>(qkv_b);
  kernels::split_qkv_heads(qkv_b, heads, DType::BF16, qb, kb, vb);
  std::fill(bq.begin(), bq.end(), 0);
  std::fill(bk.begin(), bk.end(), 0);
  std::fill(bv.begin(), bv.end(), 0);
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::to_heads_kernel<std::uint16_t, std::uint16_t>(qkv_bv.data(), out_b, l, 3, n3);
  });
  EXPECT_EQ(bq, copy_of<std::uint16_t>(qb));
  EXPECT_EQ(bk, copy_of<std::uint16_t>(kb));
  EXPECT_EQ(bv, copy_of<std::uint16_t>(vb));

  // merge_qkv_heads and its bf16 form.
  const cuda::HeadPtrs<const float> in{{hq.data(), hk.data(), hv.data()}};
  std::vector<float> packed(static_cast<std::size_t>(n3));
  simt::launch(kBlocks, kThreads, 0, [&] { cuda::to_packed_kernel(packed.data(), in, l, 3, n3); });
  EXPECT_EQ(packed, copy_of<float>(kernels::merge_qkv_heads(q, k, v)));
  EXPECT_EQ(packed, qkv_v);  // and the split's inverse
  std::vector<std::uint16_t> packed_b(static_cast<std::size_t>(n3));
  simt::launch(kBlocks, kThreads, 0,
               [&] { cuda::to_packed_kernel(packed_b.data(), in, l, 3, n3); });
  EXPECT_EQ(packed_b, copy_of<std::uint16_t>(kernels::merge_qkv_heads_bf16(q, k, v)));

  // One tensor: split_heads, merge_heads, merge_heads_bf16 with the heads' own rounding.
  const Tensor x = Tensor::randn({b, t, heads * d}, gen);
  const std::vector<float> xv = copy_of<float>(x);
  const Tensor xh = kernels::split_heads(x, heads);
  std::vector<float> h1 = sized<float>(xh);
  const cuda::HeadPtrs<float> out1{{h1.data(), nullptr, nullptr}};
  simt::launch(kBlocks, kThreads, 0, [&] { cuda::to_heads_kernel(xv.data(), out1, l, 1, n1); });
  EXPECT_EQ(h1, copy_of<float>(xh));
  const cuda::HeadPtrs<const float> in1{{h1.data(), nullptr, nullptr}};
  std::vector<float> merged(static_cast<std::size_t>(n1));
  simt::launch(kBlocks, kThreads, 0, [&] { cuda::to_packed_kernel(merged.data(), in1, l, 1, n1); });
  EXPECT_EQ(merged, copy_of<float>(kernels::merge_heads(xh)));
  Tensor heads_b_want;
  const Tensor merged_b_want = kernels::merge_heads_bf16(xh, &heads_b_want);
  std::vector<std::uint16_t> merged_b(static_cast<std::size_t>(n1)), heads_b = merged_b;
  simt::launch(kBlocks, kThreads, 0, [&] {
    cuda::to_packed_bf16_kernel(merged_b.data(), h1.data(), heads_b.data(), l, n1);
  });
  EXPECT_EQ(merged_b, copy_of<std::uint16_t>(merged_b_want));
  EXPECT_EQ(heads_b, copy_of<std::uint16_t>(heads_b_want));
}

TEST(HeadsLayoutEmulated, SplitsAndMergesMatchTheCpuBitForBit) {
  check_layout(2, 5, 3, 4);
  check_layout(1, 7, 2, 64);
  check_layout(3, 1, 1, 1);
}

}  // namespace
}  // namespace hpm
