// Embedding lookup and its gradient (elementwise.cpp's embedding_forward / embedding_backward).
//
// Forward: the indices live on the device, so their range is checked there: a bad one records its
// position in a deferred check's word (the smallest position wins, as the CPU throws at the
// first), which the host reads at its next copy from the device to throw the CPU's
// std::out_of_range (deferred_checks.h); the bad position's row is zeros meanwhile.
//
// Backward: grad_table[idx[i]] += grad_y[i] for every position i. Positions that share a row must
// not race, and float atomics would sum in a varying order. Instead the (index, position) pairs
// are radix-sorted by index (CUB's sort is stable, so each row's positions stay in increasing
// order), and the first sorted entry of each row's run owns that row: its block adds the run's
// gradients in an order fixed by the run (embedding_kernels.cuh), the same run to run.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/backend/cuda/deferred_checks.h"
#include "tensor/backend/cuda/embedding_kernels.cuh"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr int kBlock = 256;

// The smallest position whose index is outside [0, v), into *error.
__global__ void check_indices_kernel(const std::int64_t* __restrict__ idx, std::int64_t n,
                                     std::int64_t v, unsigned long long* __restrict__ error) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (idx[i] < 0 || idx[i] >= v) atomicMin(error, static_cast<unsigned long long>(i));
  }
}

// y[i, :] = table[idx[i], :]; zeros for a bad index (the check reports it).
__global__ void embedding_forward_kernel(const float* __restrict__ table,
                                         const std::int64_t* __restrict__ idx,
                                         float* __restrict__ y, std::int64_t n, std::int64_t v,
                                         std::int64_t e) {
  const std::int64_t total = n * e;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t k = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += stride) {
    const std::int64_t i = k / e, j = k - i * e;
    const std::int64_t row = idx[i];
    y[k] = row >= 0 && row < v ? table[row * e + j] : 0.0f;
  }
}

// Sort input: key = the index, or v for one outside [0, v) (sorted last and skipped: the CPU does
// not check the backward's indices, and a stray write is worse than a dropped one); value = the
// position.
__global__ void sort_input_kernel(const std::int64_t* __restrict__ idx, std::int64_t n,
                                  std::int64_t v, unsigned long long* __restrict__ keys,
                                  std::int64_t* __restrict__ positions) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const std::int64_t row = idx[i];
    keys[i] = static_cast<unsigned long long>(row >= 0 && row < v ? row : v);
    positions[i] = i;
  }
}

// Bits that hold every key in [0, v].
int key_bits(std::int64_t v) {
  int bits = 1;
  while (bits < 64 && (static_cast<unsigned long long>(v) >> bits) != 0) ++bits;
  return bits;
}

}  // namespace

Tensor embedding_forward(const Tensor& table, const Tensor& indices) {
  const std::int64_t v = table.size(0), e = table.size(1);
  std::vector<std::int64_t> dims = indices.shape().dims();
  dims.push_back(e);
  Tensor y = Tensor::empty(Shape(dims), DType::F32);
  require_dtype(indices, DType::I64);
  require_dtype(table, DType::F32);
  const std::int64_t n = indices.numel();
  if (n == 0) return y;
  cudaStream_t stream = current_stream();
  const auto* pi = ptr<std::int64_t>(indices);
  const IndexCheck check =
      defer_index_check(current_context(), indices, [v](std::int64_t position, std::int64_t index) {
        return "embedding: index " + std::to_string(index) + " at position " +
               std::to_string(position) + " out of range for " + std::to_string(v) + " rows";
      });
  unsigned long long* perr = check.word();
  check_indices_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(pi, n, v, perr);
  HPM_CUDA_LAUNCH_CHECK("check_indices_kernel");
  if (e > 0) {
    embedding_forward_kernel<<<blocks_for(n * e, kBlock), kBlock, 0, stream>>>(
        ptr<float>(table), pi, ptr<float>(y), n, v, e);
    HPM_CUDA_LAUNCH_CHECK("embedding_forward_kernel");
  }
  return y;
}

void embedding_backward(const Tensor& grad_y, const Tensor& indices, Tensor& grad_table) {
  const std::int64_t v = grad_table.size(0), e = grad_table.size(1);
  require_dtype(indices, DType::I64);
  require_dtype(grad_y, DType::F32);
  require_dtype(grad_table, DType::F32);
  const std::int64_t n = indices.numel();
  if (grad_y.numel() != n * e) {
    throw std::invalid_argument("embedding backward: grad_y of " + grad_y.shape().str() + " for " +
                                std::to_string(n) + " indices of " + std::to_string(e) +
                                " columns");
  }
  if (n == 0 || e == 0 || v == 0) return;
  cudaStream_t stream = current_stream();
  Tensor keys_in = Tensor::empty({n}, DType::I64), keys_out = Tensor::empty({n}, DType::I64);
  Tensor pos_in = Tensor::empty({n}, DType::I64), pos_out = Tensor::empty({n}, DType::I64);
  auto* kin = ptr<unsigned long long>(keys_in);
  auto* kout = ptr<unsigned long long>(keys_out);
  auto* pin = ptr<std::int64_t>(pos_in);
  auto* pout = ptr<std::int64_t>(pos_out);
  sort_input_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(ptr<std::int64_t>(indices), n, v,
                                                                  kin, pin);
  HPM_CUDA_LAUNCH_CHECK("sort_input_kernel");
  const int end_bit = key_bits(v);
  std::size_t temp_bytes = 0;
  HPM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, pin, pout, n, 0,
                                                 end_bit, stream));
  Tensor temp =
      Tensor::empty({static_cast<std::int64_t>(temp_bytes > 0 ? temp_bytes : 1)}, DType::U8);
  HPM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(device_ptr(temp), temp_bytes, kin, kout, pin, pout,
                                                 n, 0, end_bit, stream));
  Tensor ends = Tensor::empty({v}, DType::I64);
  run_ends_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(kout, n, v,
                                                                ptr<std::int64_t>(ends));
  HPM_CUDA_LAUNCH_CHECK("run_ends_kernel");
  embedding_backward_kernel<<<grid_for(n), kRunThreads, 0, stream>>>(
      ptr<float>(grad_y), kout, pout, ptr<std::int64_t>(ends), ptr<float>(grad_table), n, v, e);
  HPM_CUDA_LAUNCH_CHECK("embedding_backward_kernel");
}

}  // namespace hpm::cuda
