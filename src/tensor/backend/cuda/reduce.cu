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
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;
// Pass 1's work: about this many threads (one item each), or blocks (one item each).
constexpr std::int64_t kTargetThreads = std::int64_t{1} << 17;
constexpr std::int64_t kTargetBlocks = 1024;
// ... without cutting an output's range finer than this many elements per thread.
constexpr std::int64_t kMinPerThread = 64;
constexpr std::int64_t kMinPerBlockThread = 8;
constexpr std::int64_t kMaxGrid = 65535 * 8;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// ---- the sum plan ---------------------------------------------------------------------------

// Kept dimensions (row-major: output element o decomposes over them) and reduced ones (element
// r of an output's range decomposes over them, in x's order, so that r increasing walks x
// forwards), each with its stride in x.
struct ReducePlan {
  int nk = 0, nr = 0;
  std::int64_t kdims[kMaxDims] = {}, kstrides[kMaxDims] = {};
  std::int64_t rdims[kMaxDims] = {}, rstrides[kMaxDims] = {};
  std::int64_t outputs = 1, count = 1;  // output elements; summands per output

  __device__ std::int64_t kept_offset(std::int64_t o) const {
    std::int64_t off = 0;
    for (int d = nk - 1; d >= 0; --d) {
      off += (o % kdims[d]) * kstrides[d];
      o /= kdims[d];
    }
    return off;
  }
  __device__ std::int64_t reduced_offset(std::int64_t r) const {
    if (nr == 1) return r * rstrides[0];
    std::int64_t off = 0;
    for (int d = nr - 1; d >= 0; --d) {
      off += (r % rdims[d]) * rstrides[d];
      r /= rdims[d];
    }
    return off;
  }
};

// The plan for a contiguous tensor of `shape` with dimension d summed where reduced[d].
ReducePlan make_plan(const Shape& shape, const std::vector<bool>& reduced, const char* what) {
  ReducePlan p;
  std::vector<std::int64_t> strides(static_cast<std::size_t>(shape.rank()));
  std::int64_t stride = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    strides[static_cast<std::size_t>(d)] = stride;
    stride *= shape[d];
  }
  int last = -1;  // the kind of the last dimension taken (0 kept, 1 reduced)
  for (int d = 0; d < shape.rank(); ++d) {
    const auto du = static_cast<std::size_t>(d);
    const std::int64_t size = shape[d];
    if (size == 1) continue;  // offsets nothing
    const int kind = reduced[du] ? 1 : 0;
    int& n = kind ? p.nr : p.nk;
    std::int64_t* dims = kind ? p.rdims : p.kdims;
    std::int64_t* st = kind ? p.rstrides : p.kstrides;
    if (kind == last) {
      // x is contiguous: the previous dimension of this kind (only size-1 ones between) steps
      // exactly `size` of this one, so the two are one dimension.
      dims[n - 1] *= size;
      st[n - 1] = strides[du];
    } else {
      if (n == kMaxDims) {
        throw std::invalid_argument(std::string(what) + ": " + shape.str() +
                                    " alternates summed and kept dimensions too often");
      }
      dims[n] = size;
      st[n] = strides[du];
      ++n;
    }
    last = kind;
  }
  p.outputs = 1;
  for (int d = 0; d < p.nk; ++d) p.outputs *= p.kdims[d];
  p.count = 1;
  for (int d = 0; d < p.nr; ++d) p.count *= p.rdims[d];
  return p;
}

// ---- the sum kernels --------------------------------------------------------------------

template <bool Square>
__device__ inline double term(float v) {
  const double d = v;
  return Square ? d * d : d;
}

// Writes an item's sum: straight to the output when there is one chunk, else to its slot
// (chunk-major: partials[s * outputs + o]).
template <typename Out>
__device__ inline void store(double sum, std::int64_t item, std::int64_t o, std::int64_t splits,
                             Out* y, double* partials) {
  if (splits == 1) {
    y[o] = static_cast<Out>(sum);
  } else {
    partials[item] = sum;
  }
}

// One thread per (chunk, output); neighbouring threads take neighbouring outputs.
template <bool Square, typename Out>
__global__ void reduce_threads_kernel(const float* x, ReducePlan p, std::int64_t splits,
                                      std::int64_t chunk, Out* y, double* partials) {
  const std::int64_t items = p.outputs * splits;
  for (std::int64_t item = first_index(); item < items; item += grid_stride()) {
    const std::int64_t s = item / p.outputs, o = item % p.outputs;
    const float* base = x + p.kept_offset(o);
    const std::int64_t r0 = s * chunk, r1 = min(p.count, r0 + chunk);
    double sum = 0.0;
    if (p.nr <= 1) {
      const std::int64_t st = p.nr == 1 ? p.rstrides[0] : 0;
      for (std::int64_t r = r0; r < r1; ++r) sum += term<Square>(base[r * st]);
    } else {
      // Walk the reduced multi-index forwards instead of dividing at every element.
      std::int64_t idx[kMaxDims];
      std::int64_t rest = r0, off = 0;
      for (int d = p.nr - 1; d >= 0; --d) {
        idx[d] = rest % p.rdims[d];
        rest /= p.rdims[d];
        off += idx[d] * p.rstrides[d];
      }
      for (std::int64_t r = r0; r < r1; ++r) {
        sum += term<Square>(base[off]);
        for (int d = p.nr - 1; d >= 0; --d) {
          off += p.rstrides[d];
          if (++idx[d] < p.rdims[d]) break;
          off -= p.rstrides[d] * p.rdims[d];
          idx[d] = 0;
        }
      }
    }
    store(sum, item, o, splits, y, partials);
  }
}

// The block's values summed by a fixed tree (the same order every run); every thread gets it.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();  // before the next use of `shared`
  return total;
}

// One block per (chunk, output): its threads stride the chunk, then a tree adds them.
template <bool Square, typename Out>
__global__ void reduce_blocks_kernel(const float* x, ReducePlan p, std::int64_t splits,
                                     std::int64_t chunk, Out* y, double* partials) {
  __shared__ double shared[kThreads];
  const std::int64_t items = p.outputs * splits;
  for (std::int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const std::int64_t s = item / p.outputs, o = item % p.outputs;
    const float* base = x + p.kept_offset(o);
    const std::int64_t r0 = s * chunk, r1 = min(p.count, r0 + chunk);
    double sum = 0.0;
    for (std::int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
      sum += term<Square>(base[p.reduced_offset(r)]);
    }
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) store(sum, item, o, splits, y, partials);
  }
}

// Pass 2: each output's chunk sums, added in chunk order.
template <typename Out>
__global__ void reduce_finish_kernel(const double* partials, std::int64_t outputs,
                                     std::int64_t splits, Out* y) {
  for (std::int64_t o = first_index(); o < outputs; o += grid_stride()) {
    double sum = 0.0;
    for (std::int64_t s = 0; s < splits; ++s) sum += partials[s * outputs + o];
    y[o] = static_cast<Out>(sum);
  }
}

// Sums x (F32, laid out as `p` says) into y[0, p.outputs): Out is float or double.
template <bool Square, typename Out>
void run_reduce(const Tensor& x, const ReducePlan& p, Out* y, const char* name) {
  if (p.outputs == 0) return;
  const float* px = ptr<const float>(x);
  // Threads when the kept dimensions include x's innermost one (coalesced across outputs) or
  // there is little to sum per output; blocks when each output sums a contiguous range.
  const bool threads = (p.nk > 0 && p.kstrides[p.nk - 1] == 1) || p.count <= 32;
  std::int64_t splits = 1;
  if (p.count > 0) {
    const std::int64_t want = ceil_div(threads ? kTargetThreads : kTargetBlocks, p.outputs);
    const std::int64_t most =
        ceil_div(p.count, threads ? kMinPerThread : kMinPerBlockThread * kThreads);
    splits = std::max<std::int64_t>(1, std::min(want, most));
  }
  const std::int64_t chunk = std::max<std::int64_t>(1, ceil_div(p.count, splits));
  if (p.count > 0) splits = ceil_div(p.count, chunk);  // no empty trailing chunk
  const std::int64_t items = p.outputs * splits;
  Tensor partials;
  double* pp = nullptr;
  if (splits > 1) {
    partials = Tensor::empty(Shape{items}, DType::F64, x.device());
    pp = ptr<double>(partials);
  }
  cudaStream_t stream = current_stream();
  if (threads) {
    reduce_threads_kernel<Square, Out>
        <<<blocks_for(items, kThreads), kThreads, 0, stream>>>(px, p, splits, chunk, y, pp);
  } else {
    const auto blocks = static_cast<unsigned>(std::min(items, kMaxGrid));
    reduce_blocks_kernel<Square, Out><<<blocks, kThreads, 0, stream>>>(px, p, splits, chunk, y, pp);
  }
  HPM_CUDA_LAUNCH_CHECK(name);
  if (splits > 1) {
    reduce_finish_kernel<Out>
        <<<blocks_for(p.outputs, kThreads), kThreads, 0, stream>>>(pp, p.outputs, splits, y);
    HPM_CUDA_LAUNCH_CHECK(name);
  }
  // `partials` may be freed now: the allocator hands it out again only to work issued later on
  // this same stream.
}

// Every element of x as one range.
ReducePlan whole(const Tensor& x) {
  ReducePlan p;
  p.nr = 1;
  p.rdims[0] = x.numel();
  p.rstrides[0] = 1;
  p.outputs = 1;
  p.count = x.numel();
  return p;
}

// squared_norm over many tensors in a few launches (a model's gradients: one launch per
// kNormList tensors rather than one or two per tensor). Each block sums the squares of one chunk
// of kNormChunk elements of one tensor in double into its partial; one block then adds the
// partials, each thread a strided run, then its tree. A fixed order that depends on the shapes
// only.
constexpr int kNormList = 48;
constexpr std::int64_t kNormChunk = 16384;
struct NormList {
  const float* x[kNormList];
  std::int64_t n[kNormList];
  int first_block[kNormList + 1];
  int count;
};
static_assert(sizeof(NormList) < 3500, "NormList must fit a kernel argument");

__global__ void chunk_squares_kernel(NormList l, double* __restrict__ partials) {
  int t = 0;
  while (t + 1 < l.count && l.first_block[t + 1] <= static_cast<int>(blockIdx.x)) ++t;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.x - l.first_block[t]) * kNormChunk;
  const std::int64_t end = begin + kNormChunk < l.n[t] ? begin + kNormChunk : l.n[t];
  double s = 0.0;
  for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    const double v = l.x[t][k];
    s += v * v;
  }
  __shared__ double shared[kThreads];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void add_partials_kernel(const double* __restrict__ partials, std::int64_t n,
                                    double* __restrict__ total) {
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  __shared__ double shared[kThreads];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *total = s;
}

// ---- gathers ----------------------------------------------------------------------------

__global__ void gather_kernel(const float* x, float* y, std::int64_t n, Gather g) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[g.offset(i)];
}

// ---- argmax -------------------------------------------------------------------------------

// (value, index) of the first largest non-NaN element seen; index -1 for none yet.
struct Best {
  float value;
  std::int64_t index;
};
__device__ inline Best better(Best a, Best b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// One warp per row. The CPU keeps the first j with row[j] > row[best], starting from best = 0:
// the first largest of the non-NaN values, except that a NaN first element (which no comparison
// beats) stays the answer; an all-NaN row gives 0 too. In: float, or std::uint16_t for bf16
// (compared as its f32 widening).
template <typename In>
__global__ void argmax_last_kernel(const In* x, std::int64_t rows, std::int64_t d,
                                   std::int64_t* y) {
  const unsigned lane = threadIdx.x % 32;
  const std::int64_t warps = grid_stride() / 32;
  for (std::int64_t r = first_index() / 32; r < rows; r += warps) {
    const In* row = x + r * d;
    Best best{0.0f, -1};
    for (std::int64_t j = lane; j < d; j += 32) {
      const float v = as_f32(row[j]);
      if (v == v && (best.index < 0 || v > best.value)) best = {v, j};  // first max in the lane
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const Best other{__shfl_down_sync(0xffffffffu, best.value, offset),
                       __shfl_down_sync(0xffffffffu, best.index, offset)};
      best = better(best, other);
    }
    if (lane == 0) {
      const float first = as_f32(row[0]);
      y[r] = (first != first || best.index < 0) ? 0 : best.index;
    }
  }
}

}  // namespace

Tensor sum_all(const Tensor& x) {
  require_dtype(x, DType::F32);
  Tensor y = Tensor::empty(Shape{}, DType::F32, x.device());
  run_reduce<false>(x, whole(x), ptr<float>(y), "sum_all");
  return y;
}

Tensor sum_squares(const Tensor& x) {
  require_dtype(x, DType::F32);
  Tensor y = Tensor::empty(Shape{}, DType::F64, x.device());
  run_reduce<true>(x, whole(x), ptr<double>(y), "sum_squares");
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
  std::int64_t chunks = 0;
  for (const Tensor& x : xs) chunks += ceil_div(x.numel(), kNormChunk);
  cudaStream_t stream = current_stream();
  if (chunks == 0) {
    HPM_CUDA_CHECK(cudaMemsetAsync(ptr<double>(total), 0, sizeof(double), stream));
    return total;
  }
  Tensor partials = Tensor::empty(Shape{chunks}, DType::F64, device);
  std::int64_t done = 0;  // partials written by earlier launches
  NormList l{};
  const auto launch = [&] {
    if (l.count == 0) return;
    chunk_squares_kernel<<<static_cast<unsigned>(l.first_block[l.count]), kThreads, 0, stream>>>(
        l, ptr<double>(partials) + done);
    HPM_CUDA_LAUNCH_CHECK("chunk_squares_kernel");
    done += l.first_block[l.count];
    l = NormList{};
  };
  for (const Tensor& x : xs) {
    const std::int64_t n = x.numel();
    if (n == 0) continue;
    const auto blocks = static_cast<int>(ceil_div(n, kNormChunk));
    if (l.count == kNormList || l.first_block[l.count] > (1 << 30) - blocks) launch();
    l.x[l.count] = ptr<const float>(x);
    l.n[l.count] = n;
    l.first_block[l.count + 1] = l.first_block[l.count] + blocks;
    ++l.count;
  }
  launch();
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
    run_reduce<false>(x, whole(x), ptr<float>(y), "sum_to");
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

// [matches, counted] of top-1 accuracy: per-thread counts, a warp's sum, one integer atomic per
// warp (integer sums do not depend on their order).
__global__ void count_matches_kernel(const std::int64_t* predicted, const std::int64_t* labels,
                                     std::int64_t n, std::int64_t ignore_index,
                                     unsigned long long* counts) {
  unsigned long long matches = 0, counted = 0;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const std::int64_t y = labels[i];
    if (y == ignore_index) continue;
    ++counted;
    matches += predicted[i] == y ? 1ull : 0ull;
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    matches += __shfl_xor_sync(kFullMask, matches, offset);
    counted += __shfl_xor_sync(kFullMask, counted, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    if (matches != 0) atomicAdd(counts, matches);
    if (counted != 0) atomicAdd(counts + 1, counted);
  }
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
