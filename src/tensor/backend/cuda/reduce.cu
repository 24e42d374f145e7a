// Reductions on the GPU (sum_all, sum_squares, squared_norm, sum_dim, sum_to), broadcast_to and
// argmax_last. Every sum is one plan: x's dimensions split into kept ones (the output's, in
// order) and reduced ones, each run of neighbours of one kind merged into a single dimension
// (sum_dim is always outer-kept, reduced, inner-kept). Sums accumulate in double, in a fixed
// order that depends only on the shapes, so that a result is the same bits on every run (no
// float atomics):
//   - pass 1 cuts each output's reduced range into `splits` chunks, one work item per
//     (chunk, output), and sums each item: one thread per item when the kept dimensions are the
//     contiguous ones (neighbouring threads then read neighbouring addresses: a bias gradient's
//     (N, C) -> (C)), else one block per item with a shared-memory tree (a row's sum);
//   - pass 2, when there is more than one chunk, adds each output's chunk sums in chunk order.
// The chunk counts are picked to fill the GPU: a whole-tensor sum runs on ~1024 blocks, not one.
// The kernels, the plan and its grid are reduce_kernels.cuh's.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/reduce_kernels.cuh"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

// Sums x (F32, laid out as `p` says) into y[0, p.outputs): Out is float or double.
template <bool Square, typename Out>
void run_reduce(const Tensor& x, const ReducePlan& p, Out* y, const char* name) {
  if (p.outputs == 0) return;
  const float* px = ptr<const float>(x);
  const ReduceGrid g = reduce_grid(p);
  Tensor partials;
  double* pp = nullptr;
  if (g.splits > 1) {
    partials = Tensor::empty(Shape{g.items}, DType::F64, x.device());
    pp = ptr<double>(partials);
  }
  cudaStream_t stream = current_stream();
  if (g.threads) {
    reduce_threads_kernel<Square, Out>
        <<<g.blocks, kThreads, 0, stream>>>(px, p, g.splits, g.chunk, y, pp);
  } else {
    reduce_blocks_kernel<Square, Out>
        <<<g.blocks, kThreads, 0, stream>>>(px, p, g.splits, g.chunk, y, pp);
  }
  HPM_CUDA_LAUNCH_CHECK(name);
  if (g.splits > 1) {
    reduce_finish_kernel<Out>
        <<<blocks_for(p.outputs, kThreads), kThreads, 0, stream>>>(pp, p.outputs, g.splits, y);
    HPM_CUDA_LAUNCH_CHECK(name);
  }
  // `partials` may be freed now: the allocator hands it out again only to work issued later on
  // this same stream.
}

__global__ void gather_kernel(const float* x, float* y, std::int64_t n, Gather g) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[g.offset(i)];
}

}  // namespace

Tensor sum_all(const Tensor& x) {
  require_dtype(x, DType::F32);
  Tensor y = Tensor::empty(Shape{}, DType::F32, x.device());
  run_reduce<false>(x, whole(x.numel()), ptr<float>(y), "sum_all");
  return y;
}

Tensor sum_squares(const Tensor& x) {
  require_dtype(x, DType::F32);
  Tensor y = Tensor::empty(Shape{}, DType::F64, x.device());
  run_reduce<true>(x, whole(x.numel()), ptr<double>(y), "sum_squares");
  return y;
}

Tensor squared_norm(const std::vector<Tensor>& xs) {
  for (const Tensor& x : xs) require_dtype(x, DType::F32);
  Device& device = xs.empty() ? Device::current() : xs[0].device();
  Tensor total = Tensor::empty(Shape{}, DType::F64, device);
  if (xs.empty()) {
    HPM_CUDA_CHECK(cudaMemsetAsync(ptr<double>(total), 0, sizeof(double), current_stream()));
    return total;
  }
  std::int64_t chunks = 0;  // partials: one per kNormChunk elements of each tensor
  for (const Tensor& x : xs) chunks += ceil_div(x.numel(), kNormChunk);
  cudaStream_t stream = current_stream();
  if (chunks == 0) {
    HPM_CUDA_CHECK(cudaMemsetAsync(ptr<double>(total), 0, sizeof(double), stream));
    return total;
  }
  Tensor partials = Tensor::empty(Shape{chunks}, DType::F64, device);
  std::int64_t done = 0;  // partials written by earlier launches
  const auto launch = [&](const NormList& l, unsigned blocks) {
    chunk_squares_kernel<<<blocks, kThreads, 0, stream>>>(l, ptr<double>(partials) + done);
    HPM_CUDA_LAUNCH_CHECK("chunk_squares_kernel");
    done += blocks;
  };
  NormPacker packer;
  for (const Tensor& x : xs) {
    if (x.numel() > 0) packer.add(ptr<const float>(x), x.numel(), launch);
  }
  packer.flush(launch);
  add_partials_kernel<<<1, kThreads, 0, stream>>>(ptr<const double>(partials), chunks,
                                                  ptr<double>(total));
  HPM_CUDA_LAUNCH_CHECK("add_partials_kernel");
  return total;
}

Tensor sum_dim(const Tensor& x, int dim, bool keepdim) {
  const int d = x.shape().wrap(dim);
  require_dtype(x, DType::F32);
  std::vector<std::int64_t> dims = x.shape().dims();
  if (keepdim) {
    dims[static_cast<std::size_t>(d)] = 1;
  } else {
    dims.erase(dims.begin() + d);
  }
  Tensor y = Tensor::empty(Shape(dims), DType::F32, x.device());
  std::vector<bool> reduced(static_cast<std::size_t>(x.dim()), false);
  reduced[static_cast<std::size_t>(d)] = true;
  run_reduce<false>(x, make_plan(x.shape(), reduced, "sum_dim"), ptr<float>(y), "sum_dim");
  return y;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;  // the CPU's identity: the tensor itself, any dtype
  require_dtype(x, DType::F32);
  Tensor y = Tensor::empty(shape, DType::F32, x.device());
  if (shape.numel() == 1) {  // one output, whatever the ranks (the CPU: a full of sum_all)
    run_reduce<false>(x, whole(x.numel()), ptr<float>(y), "sum_to");
    return y;
  }
  // shape aligned with x's trailing dimensions: a dimension is summed where shape has 1 (or
  // nothing) and x more. The CPU does not check this (it would index out of bounds).
  const int lead = x.dim() - shape.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(x.dim()), true);
  bool fits = lead >= 0;
  for (int i = 0; fits && i < shape.rank(); ++i) {
    const std::int64_t want = shape[i], have = x.size(lead + i);
    fits = want == have || want == 1;
    reduced[static_cast<std::size_t>(lead + i)] = want != have;
  }
  if (!fits) {
    throw std::invalid_argument("sum_to: " + x.shape().str() + " does not reduce to " +
                                shape.str());
  }
  run_reduce<false>(x, make_plan(x.shape(), reduced, "sum_to"), ptr<float>(y), "sum_to");
  return y;
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  // The CPU does not check this (it would read out of bounds).
  if (x.dim() > shape.rank() || broadcast_shapes(x.shape(), shape) != shape) {
    throw std::invalid_argument("broadcast_to: " + x.shape().str() + " does not broadcast to " +
                                shape.str());
  }
  require_dtype(x, DType::F32);
  // x's strides seen from `shape` (0 along broadcast dimensions), as cpu/broadcast.h.
  std::vector<std::int64_t> st(static_cast<std::size_t>(shape.rank()), 0);
  std::int64_t stride = 1;
  for (int i = x.dim() - 1, j = shape.rank() - 1; i >= 0; --i, --j) {
    st[static_cast<std::size_t>(j)] = x.size(i) == 1 ? 0 : stride;
    stride *= x.size(i);
  }
  const Gather g = make_gather(shape, st, "broadcast_to");
  Tensor y = Tensor::empty(shape, DType::F32, x.device());
  const std::int64_t n = shape.numel();
  if (n > 0) {
    gather_kernel<<<blocks_for(n, kThreads), kThreads, 0, current_stream()>>>(ptr<const float>(x),
                                                                              ptr<float>(y), n, g);
    HPM_CUDA_LAUNCH_CHECK("broadcast_to");
  }
  return y;
}

Tensor count_matches(const Tensor& predicted, const Tensor& labels, std::int64_t ignore_index) {
  require_dtype(predicted, DType::I64);
  require_dtype(labels, DType::I64);
  Tensor counts = Tensor::empty(Shape{2}, DType::I64, labels.device());
  cudaStream_t stream = current_stream();
  HPM_CUDA_CHECK(cudaMemsetAsync(ptr<std::int64_t>(counts), 0, 2 * sizeof(std::int64_t), stream));
  const std::int64_t n = labels.numel();
  if (n > 0) {
    const auto blocks = static_cast<unsigned>(std::min(ceil_div(n, kThreads), kMaxGrid));
    count_matches_kernel<<<blocks, kThreads, 0, stream>>>(
        ptr<const std::int64_t>(predicted), ptr<const std::int64_t>(labels), n, ignore_index,
        reinterpret_cast<unsigned long long*>(ptr<std::int64_t>(counts)));
    HPM_CUDA_LAUNCH_CHECK("count_matches");
  }
  return counts;
}

Tensor argmax_last(const Tensor& x) {
  const std::int64_t d = x.size(-1);
  if (x.dtype() != DType::BF16) require_dtype(x, DType::F32);
  if (d == 0) {  // the CPU would divide by zero
    throw std::invalid_argument("argmax_last: empty last dimension in " + x.shape().str());
  }
  const std::int64_t rows = x.numel() / d;
  std::vector<std::int64_t> dims(x.shape().dims().begin(), x.shape().dims().end() - 1);
  Tensor y = Tensor::empty(Shape(dims), DType::I64, x.device());
  if (rows > 0) {
    constexpr std::int64_t kRowsPerBlock = kThreads / 32;
    const auto blocks = static_cast<unsigned>(std::min(ceil_div(rows, kRowsPerBlock), kMaxGrid));
    if (x.dtype() == DType::BF16) {
      argmax_last_kernel<<<blocks, kThreads, 0, current_stream()>>>(ptr<const std::uint16_t>(x),
                                                                    rows, d, ptr<std::int64_t>(y));
    } else {
      argmax_last_kernel<<<blocks, kThreads, 0, current_stream()>>>(ptr<const float>(x), rows, d,
                                                                    ptr<std::int64_t>(y));
    }
    HPM_CUDA_LAUNCH_CHECK("argmax_last");
  }
  return y;
}

}  // namespace hpm::cuda
