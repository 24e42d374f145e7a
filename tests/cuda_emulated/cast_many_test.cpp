// elementwise.cu's to_bf16_many (cast_many_kernels.cuh: the kernel and the packing of tensors into
// its lists, as the launcher packs them), compiled for the CPU and run under simt.h's emulation,
// against the CPU's to_bf16 bit for bit: more tensors than a list holds, an empty one, one of
// several chunks, odd lengths, a tensor that is not 16-byte aligned.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/cast_many_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;

TEST(CastManyEmulated, MatchesToBf16BitForBit) {
  Generator gen(7);
  // 67 tensors: 8193 elements (two chunks, the second of one), none, 17 read from one float past
  // an aligned start, then 64 of 1 to 40 elements.
  std::vector<std::vector<float>> xs{
      copy_of(Tensor::randn({8193}, gen)), {}, copy_of(Tensor::randn({18}, gen))};
  for (int i = 0; i < 64; ++i) xs.push_back(copy_of(Tensor::randn({1 + (i * 7) % 40}, gen)));
  xs[2][0] = 1e30f;  // not read: the tensor starts one past it
  std::vector<std::vector<std::uint16_t>> ys;
  for (const auto& x : xs) ys.emplace_back(x.size(), 0xffffu);
  int launches = 0;
  const auto launch = [&](const cuda::CastList& l, unsigned blocks) {
    ++launches;
    simt::launch(blocks, 256, 0, [&] { cuda::f32_to_bf16_many_kernel(l); });
  };
  cuda::CastPacker packer;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t skip = i == 2 ? 1 : 0;
    packer.add(xs[i].data() + skip, ys[i].data() + skip,
               static_cast<std::int64_t>(xs[i].size() - skip), launch);
  }
  packer.flush(launch);
  EXPECT_EQ(launches, 2);  // 66 non-empty tensors: a full list of 64, then 2
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t skip = i == 2 ? 1 : 0;
    const std::vector<float> x(xs[i].begin() + static_cast<std::ptrdiff_t>(skip), xs[i].end());
    const Tensor want =
        kernels::to_bf16(Tensor::from(x, Shape{static_cast<std::int64_t>(x.size())}));
    const std::vector<std::uint16_t> got(ys[i].begin() + static_cast<std::ptrdiff_t>(skip),
                                         ys[i].end());
    EXPECT_EQ(got, copy_of<std::uint16_t>(want)) << "tensor " << i;
    if (skip) {
      EXPECT_EQ(ys[i][0], 0xffffu) << "the element before tensor 2";
    }
  }
}

}  // namespace
}  // namespace hpm
