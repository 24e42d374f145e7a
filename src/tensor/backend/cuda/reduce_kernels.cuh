// The kernels of reduce.cu (its opening comment tells the sum plan), with the host-side choices the
// launchers make (the plan, its grid, the squared norm's tensor lists), apart from the launchers so
// that tests/cuda_emulated can compile them for the CPU too (HPM_SIMT_EMULATION).
#pragma once
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "hpm/tensor/tensor.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/tensor_lists.h"

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

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// ---- the sum plan ---------------------------------------------------------------------------

// Kept dimensions (row-major: output element o decomposes over them) and reduced ones (element
// r of an output's range decomposes over them, in x's order, so that r increasing walks x
// forwards), each with its stride in x.
struct ReducePlan {
  int nk = 0, nr = 0;
  std::int64_t kdims[kMaxDims] = {}, kstrides[kMaxDims] = {};
  std::int64_t rdims[kMaxDims] = {}, rstrides[kMaxDims] = {};
  std::int64_t outputs = 1, count = 1;  // output elements; summands per output

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)
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
#endif
};

// The plan for a contiguous tensor of `shape` with dimension d summed where reduced[d].
inline ReducePlan make_plan(const Shape& shape, const std::vector<bool>& reduced,
                            const char* what) {
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

// Every element of a tensor of n elements as one range.
inline ReducePlan whole(std::int64_t n) {
  ReducePlan p;
  p.nr = 1;
  p.rdims[0] = n;
  p.rstrides[0] = 1;
  p.outputs = 1;
  p.count = n;
  return p;
}

// How pass 1 runs a plan: by threads or blocks, each output's range in `splits` chunks of `chunk`
// summands; `items` = outputs x splits work items. Threads when the kept dimensions include x's
// innermost one (coalesced across outputs) or there is little to sum per output; blocks when each
// output sums a contiguous range.
struct ReduceGrid {
  bool threads = true;
  std::int64_t splits = 1, chunk = 1, items = 0;
  unsigned blocks = 1;  // pass 1's grid, of kThreads each
};

inline ReduceGrid reduce_grid(const ReducePlan& p) {
  ReduceGrid g;
  g.threads = (p.nk > 0 && p.kstrides[p.nk - 1] == 1) || p.count <= 32;
  if (p.count > 0) {
    const std::int64_t want = ceil_div(g.threads ? kTargetThreads : kTargetBlocks, p.outputs);
    const std::int64_t most =
        ceil_div(p.count, g.threads ? kMinPerThread : kMinPerBlockThread * kThreads);
    g.splits = std::max<std::int64_t>(1, std::min(want, most));
  }
  g.chunk = std::max<std::int64_t>(1, ceil_div(p.count, g.splits));
  if (p.count > 0) g.splits = ceil_div(p.count, g.chunk);  // no empty trailing chunk
  g.items = p.outputs * g.splits;
  g.blocks = g.threads ? grid_for(ceil_div(g.items, kThreads))
                       : static_cast<unsigned>(std::min(g.items, kMaxGrid));
  return g;
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

// Packs squared_norm's tensors into NormLists as the launcher walks them (tensor_lists.h). Block
// b of a list writes the list's partial b; the lists' partials follow one another.
class NormPacker {
 public:
  template <typename Launch>
  void add(const float* x, std::int64_t n, Launch&& launch) {
    packer_.add(
        n, [&](NormList& l, int t) { l.x[t] = x; }, launch);
  }
  template <typename Launch>
  void flush(Launch&& launch) {
    packer_.flush(launch);
  }

 private:
  TensorListPacker<NormList, kNormList, kNormChunk> packer_;
};

#if defined(__CUDACC__) || defined(HPM_SIMT_EMULATION)  // device code, or its CPU emulation

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
    const std::int64_t r0 = s * chunk, r1 = p.count < r0 + chunk ? p.count : r0 + chunk;
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
// blockDim.x a power of two.
__device__ inline double tree_sum(double v, double* shared) {
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
    const std::int64_t r0 = s * chunk, r1 = p.count < r0 + chunk ? p.count : r0 + chunk;
    double sum = 0.0;
    for (std::int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
      sum += term<Square>(base[p.reduced_offset(r)]);
    }
    sum = tree_sum(sum, shared);
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
  s = tree_sum(s, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void add_partials_kernel(const double* __restrict__ partials, std::int64_t n,
                                    double* __restrict__ total) {
  double s = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partials[i];
  __shared__ double shared[kThreads];
  s = tree_sum(s, shared);
  if (threadIdx.x == 0) *total = s;
}

// ---- argmax and accuracy --------------------------------------------------------------------

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
      const Best other{__shfl_down_sync(kFullMask, best.value, offset),
                       __shfl_down_sync(kFullMask, best.index, offset)};
      best = better(best, other);
    }
    if (lane == 0) {
      const float first = as_f32(row[0]);
      y[r] = (first != first || best.index < 0) ? 0 : best.index;
    }
  }
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

#endif

}  // namespace

}  // namespace hpm::cuda
