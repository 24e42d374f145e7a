// Layout ops on the GPU: transpose, permute, concat and slices along a dimension, the attention
// heads' layouts and the row gather. Pure data movement, so the copies that any dtype may take
// (concat, narrow_copy, index_select0) move raw bytes in the widest unit (up to 16 bytes) that
// the run length, the pitches and the addresses allow; the others take the dtypes the CPU's do
// (cpu/elementwise.cpp, cpu/select.cpp, cpu/heads_layout.cpp), with the same checks and errors.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/heads_kernels.cuh"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGrid = 65535 * 8;

// ---- byte copies ------------------------------------------------------------------------

// The widest power-of-two unit, at most 16 bytes, dividing every byte count and address given.
int unit_bytes(std::initializer_list<std::uint64_t> values) {
  std::uint64_t all = 16;
  for (std::uint64_t v : values) all |= v;
  return static_cast<int>(all & (~all + 1));  // lowest set bit: at most 16
}

// Runs of `run` units: run k from src + k * src_pitch to dst + k * dst_pitch (units).
template <typename U>
__global__ void copy_runs_kernel(U* dst, std::int64_t dst_pitch, const U* src,
                                 std::int64_t src_pitch, std::int64_t rows, std::int64_t run) {
  const std::int64_t n = rows * run;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const std::int64_t k = i / run, j = i % run;
    dst[k * dst_pitch + j] = src[k * src_pitch + j];
  }
}

template <typename U>
void launch_copy_runs(void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch,
                      std::int64_t rows, std::int64_t run, const char* name) {
  const auto u = static_cast<std::int64_t>(sizeof(U));
  copy_runs_kernel<U><<<blocks_for(rows * (run / u), kThreads), kThreads, 0, current_stream()>>>(
      static_cast<U*>(dst), dst_pitch / u, static_cast<const U*>(src), src_pitch / u, rows,
      run / u);
  HPM_CUDA_LAUNCH_CHECK(name);
}

// `rows` runs of `run` bytes, src rows `src_pitch` bytes apart, dst rows `dst_pitch` apart.
void copy_runs(void* dst, std::int64_t dst_pitch, const void* src, std::int64_t src_pitch,
               std::int64_t rows, std::int64_t run, const char* name) {
  if (rows <= 0 || run <= 0) return;
  if (rows == 1 || (dst_pitch == run && src_pitch == run)) {  // one contiguous block
    HPM_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(rows * run),
                                   cudaMemcpyDeviceToDevice, current_stream()));
    return;
  }
  const int unit =
      unit_bytes({static_cast<std::uint64_t>(run), static_cast<std::uint64_t>(dst_pitch),
                  static_cast<std::uint64_t>(src_pitch), reinterpret_cast<std::uintptr_t>(dst),
                  reinterpret_cast<std::uintptr_t>(src)});
  switch (unit) {
    case 16:
      return launch_copy_runs<uint4>(dst, dst_pitch, src, src_pitch, rows, run, name);
    case 8:
      return launch_copy_runs<std::uint64_t>(dst, dst_pitch, src, src_pitch, rows, run, name);
    case 4:
      return launch_copy_runs<std::uint32_t>(dst, dst_pitch, src, src_pitch, rows, run, name);
    case 2:
      return launch_copy_runs<std::uint16_t>(dst, dst_pitch, src, src_pitch, rows, run, name);
    default:
      return launch_copy_runs<std::uint8_t>(dst, dst_pitch, src, src_pitch, rows, run, name);
  }
}

// y's row k (`row` units) = x's row idx[k].
template <typename U>
__global__ void index_rows_kernel(const U* x, const std::int64_t* idx, U* y, std::int64_t count,
                                  std::int64_t row) {
  const std::int64_t n = count * row;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const std::int64_t k = i / row, j = i % row;
    y[i] = x[idx[k] * row + j];
  }
}

template <typename U>
void launch_index_rows(const void* x, const std::int64_t* idx, void* y, std::int64_t count,
                       std::int64_t row_bytes) {
  const std::int64_t row = row_bytes / static_cast<std::int64_t>(sizeof(U));
  index_rows_kernel<U><<<blocks_for(count * row, kThreads), kThreads, 0, current_stream()>>>(
      static_cast<const U*>(x), idx, static_cast<U*>(y), count, row);
  HPM_CUDA_LAUNCH_CHECK("index_select0");
}

// ---- transpose and permute ----------------------------------------------------------------

constexpr int kTile = 32, kTileRows = 8;

// (r, c) -> (c, r) through a shared tile, so that both the reads and the writes are coalesced
// (the +1 column keeps the tile's column reads off a single bank). Blocks of 32 x 8 threads walk
// the tiles grid-stride.
__global__ void transpose_kernel(const float* x, float* y, std::int64_t r, std::int64_t c) {
  __shared__ float tile[kTile][kTile + 1];
  const std::int64_t tiles_c = (c + kTile - 1) / kTile;
  const std::int64_t tiles = ((r + kTile - 1) / kTile) * tiles_c;
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t i0 = (t / tiles_c) * kTile, j0 = (t % tiles_c) * kTile;
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const std::int64_t i = i0 + k, j = j0 + threadIdx.x;
      if (i < r && j < c) tile[k][threadIdx.x] = x[i * c + j];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const std::int64_t j = j0 + k, i = i0 + threadIdx.x;  // y[j][i] = x[i][j]
      if (j < c && i < r) y[j * r + i] = tile[threadIdx.x][k];
    }
    __syncthreads();  // before the next tile overwrites this one
  }
}

__global__ void gather_kernel(const float* x, float* y, std::int64_t n, Gather g) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[g.offset(i)];
}

// ---- slices -----------------------------------------------------------------------------

// A tensor seen as (outer, len * inner) around dimension d (cpu/select.cpp's Around).
struct Around {
  std::int64_t outer, inner;
};
Around around(const Shape& s, int d) { return {s.numel_before(d), s.numel_from(d + 1)}; }

// y's slice [start, start + len) along a dimension += part: part's row o (`run` elements) lands
// at y + (o * y_len + start) * inner.
__global__ void narrow_add_kernel(float* y, const float* part, std::int64_t outer, std::int64_t run,
                                  std::int64_t y_len, std::int64_t start, std::int64_t inner) {
  const std::int64_t n = outer * run;
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    const std::int64_t o = i / run, j = i % run;
    y[(o * y_len + start) * inner + j] += part[i];
  }
}

// ---- attention heads (the kernels: heads_kernels.cuh) ---------------------------------------

std::int64_t packed_numel(const HeadsLayout& l, std::int64_t parts) {
  return l.batch * l.t * parts * l.heads * l.d;
}

// x (B, T, parts x heads x D), its shape and dtype checked by the dispatcher (dispatch.cpp).
HeadsLayout packed_layout(const Tensor& x, std::int64_t parts, std::int64_t heads) {
  return {x.size(0), x.size(1), heads, x.size(2) / (parts * heads)};
}

HeadsLayout heads_layout(const std::vector<const Tensor*>& xs, const char* what) {
  const Tensor& x = *xs[0];
  for (const Tensor* y : xs) {
    if (y->dim() != 4 || y->dtype() != DType::F32 || y->shape() != x.shape()) {
      throw std::invalid_argument(std::string(what) + ": expected F32 (B, H, T, D) heads of " +
                                  "one shape, got " + dtype_name(y->dtype()) + " " +
                                  y->shape().str() + " beside " + x.shape().str());
    }
  }
  return {x.size(0), x.size(2), x.size(1), x.size(3)};
}

template <typename Head, typename Packed = float>
void to_heads(const Tensor& packed, HeadPtrs<Head> heads, const HeadsLayout& l, std::int64_t parts,
              const char* name) {
  const std::int64_t n = packed_numel(l, parts);
  if (n == 0) return;
  to_heads_kernel<Head, Packed><<<blocks_for(n, kThreads), kThreads, 0, current_stream()>>>(
      ptr<const Packed>(packed), heads, l, parts, n);
  HPM_CUDA_LAUNCH_CHECK(name);
}

template <typename Out = float>
void to_packed(Tensor& packed, HeadPtrs<const float> heads, const HeadsLayout& l,
               std::int64_t parts, const char* name) {
  const std::int64_t n = packed_numel(l, parts);
  if (n == 0) return;
  to_packed_kernel<Out><<<blocks_for(n, kThreads), kThreads, 0, current_stream()>>>(
      ptr<Out>(packed), heads, l, parts, n);
  HPM_CUDA_LAUNCH_CHECK(name);
}

}  // namespace

// ---- transpose and permute ----------------------------------------------------------------

Tensor transpose2d(const Tensor& x) {
  if (x.dim() != 2) throw std::invalid_argument("transpose2d needs 2-D, got " + x.shape().str());
  require_dtype(x, DType::F32);
  const std::int64_t r = x.size(0), c = x.size(1);
  Tensor y = Tensor::empty({c, r}, DType::F32, x.device());
  if (r > 0 && c > 0) {
    const std::int64_t tiles = ((r + kTile - 1) / kTile) * ((c + kTile - 1) / kTile);
    const auto blocks = static_cast<unsigned>(std::min(tiles, kMaxGrid));
    transpose_kernel<<<blocks, dim3(kTile, kTileRows), 0, current_stream()>>>(ptr<const float>(x),
                                                                              ptr<float>(y), r, c);
    HPM_CUDA_LAUNCH_CHECK("transpose2d");
  }
  return y;
}

Tensor permute(const Tensor& x, const std::vector<int>& perm) {
  const int r = x.dim();
  if (static_cast<int>(perm.size()) != r) {
    throw std::invalid_argument("permute: " + std::to_string(perm.size()) +
                                " axes for a tensor of rank " + std::to_string(r));
  }
  std::vector<std::int64_t> in_strides(static_cast<std::size_t>(r));
  std::int64_t stride = 1;
  for (int i = r - 1; i >= 0; --i) {
    in_strides[static_cast<std::size_t>(i)] = stride;
    stride *= x.size(i);
  }
  // Output dimension i is input dimension perm[i]: its extent, and its stride in x.
  std::vector<std::int64_t> out_dims(static_cast<std::size_t>(r));
  std::vector<std::int64_t> src_strides(static_cast<std::size_t>(r));
  std::vector<bool> seen(static_cast<std::size_t>(r), false);
  for (int i = 0; i < r; ++i) {
    const int p = x.shape().wrap(perm[static_cast<std::size_t>(i)]);
    if (seen[static_cast<std::size_t>(p)]) throw std::invalid_argument("permute: repeated axis");
    seen[static_cast<std::size_t>(p)] = true;
    out_dims[static_cast<std::size_t>(i)] = x.size(p);
    src_strides[static_cast<std::size_t>(i)] = in_strides[static_cast<std::size_t>(p)];
  }
  require_dtype(x, DType::F32);  // the CPU's permute reads F32 only
  const Shape out(out_dims);
  const Gather g = make_gather(out, src_strides, "permute");
  Tensor y = Tensor::empty(out, x.dtype(), x.device());
  const std::int64_t n = out.numel();
  if (n > 0) {
    gather_kernel<<<blocks_for(n, kThreads), kThreads, 0, current_stream()>>>(ptr<const float>(x),
                                                                              ptr<float>(y), n, g);
    HPM_CUDA_LAUNCH_CHECK("permute");
  }
  return y;
}

// ---- joining and slicing ------------------------------------------------------------------

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  if (xs.empty()) throw std::invalid_argument("concat: no tensors");
  const Shape& first = xs[0].shape();
  const int d = first.wrap(dim);
  Shape out = first;
  out[d] = 0;
  for (const Tensor& x : xs) {
    bool same = x.dim() == first.rank() && x.dtype() == xs[0].dtype();
    for (int i = 0; same && i < first.rank(); ++i) same = i == d || x.size(i) == first[i];
    if (!same) {
      throw std::invalid_argument("concat: " + x.shape().str() + " does not match " + first.str() +
                                  " outside dimension " + std::to_string(d));
    }
    out[d] += x.size(d);
  }
  Tensor y = Tensor::empty(out, xs[0].dtype(), xs[0].device());
  const auto esize = static_cast<std::int64_t>(dtype_size(y.dtype()));
  const Around a = around(out, d);
  char* py = static_cast<char*>(device_ptr(y));
  std::int64_t at = 0;  // elements into each output row where this input starts
  for (const Tensor& x : xs) {
    // x's row o (run elements) goes to y's row o (out[d] * inner elements) at `at`.
    const std::int64_t run = x.size(d) * a.inner;
    copy_runs(py + at * esize, out[d] * a.inner * esize, device_ptr(x), run * esize, a.outer,
              run * esize, "concat");
    at += run;
  }
  return y;
}

Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length) {
  const int d = x.shape().wrap(dim);
  if (start < 0 || length < 0 || start + length > x.size(d)) {
    throw std::out_of_range("narrow: [" + std::to_string(start) + ", " +
                            std::to_string(start + length) + ") is outside dimension " +
                            std::to_string(d) + " of " + x.shape().str());
  }
  Shape out = x.shape();
  out[d] = length;
  Tensor y = Tensor::empty(out, x.dtype(), x.device());
  const auto esize = static_cast<std::int64_t>(dtype_size(x.dtype()));
  const Around a = around(x.shape(), d);
  const std::int64_t run = length * a.inner;
  // x's row o (size(d) * inner elements) from `start`, to y's row o (run elements).
  copy_runs(device_ptr(y), run * esize,
            static_cast<const char*>(device_ptr(x)) + start * a.inner * esize,
            x.size(d) * a.inner * esize, a.outer, run * esize, "narrow_copy");
  return y;
}

void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part) {
  const int d = y.shape().wrap(dim);
  // The CPU trusts these (it would write out of bounds): part is y's shape but along d, and the
  // slice lies inside y.
  bool same = part.dim() == y.dim();
  for (int i = 0; same && i < y.dim(); ++i) same = i == d || part.size(i) == y.size(i);
  if (!same) {
    throw std::invalid_argument("narrow_add_: " + part.shape().str() + " does not match " +
                                y.shape().str() + " outside dimension " + std::to_string(d));
  }
  if (start < 0 || start + part.size(d) > y.size(d)) {
    throw std::out_of_range("narrow_add_: [" + std::to_string(start) + ", " +
                            std::to_string(start + part.size(d)) + ") is outside dimension " +
                            std::to_string(d) + " of " + y.shape().str());
  }
  require_dtype(part, DType::F32);
  require_dtype(y, DType::F32);
  const Around a = around(y.shape(), d);
  const std::int64_t run = part.size(d) * a.inner;
  const std::int64_t n = a.outer * run;
  if (n == 0) return;
  narrow_add_kernel<<<blocks_for(n, kThreads), kThreads, 0, current_stream()>>>(
      ptr<float>(y), ptr<const float>(part), a.outer, run, y.size(d), start, a.inner);
  HPM_CUDA_LAUNCH_CHECK("narrow_add_");
}

// ---- attention heads ------------------------------------------------------------------------

void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                     Tensor& v) {
  // A BF16 qkv (a product's bf16 output) splits into BF16 heads, its bits moved.
  const HeadsLayout l = packed_layout(qkv, 3, heads);
  const Shape shape{l.batch, l.heads, l.t, l.d};
  q = Tensor::empty(shape, dtype, qkv.device());
  k = Tensor::empty(shape, dtype, qkv.device());
  v = Tensor::empty(shape, dtype, qkv.device());
  if (dtype == DType::BF16) {  // rounded on the way, as the CPU
    const HeadPtrs<std::uint16_t> out{
        {ptr<std::uint16_t>(q), ptr<std::uint16_t>(k), ptr<std::uint16_t>(v)}};
    if (qkv.dtype() == DType::BF16) {
      to_heads<std::uint16_t, std::uint16_t>(qkv, out, l, 3, "split_qkv_heads");
      return;
    }
    to_heads(qkv, out, l, 3, "split_qkv_heads");
  } else {
    const HeadPtrs<float> out{{ptr<float>(q), ptr<float>(k), ptr<float>(v)}};
    to_heads(qkv, out, l, 3, "split_qkv_heads");
  }
}

Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v) {
  const HeadsLayout l = heads_layout({&q, &k, &v}, "merge_qkv_heads");
  Tensor qkv = Tensor::empty({l.batch, l.t, 3 * l.heads * l.d}, DType::F32, q.device());
  const HeadPtrs<const float> in{{ptr<const float>(q), ptr<const float>(k), ptr<const float>(v)}};
  to_packed(qkv, in, l, 3, "merge_qkv_heads");
  return qkv;
}

Tensor merge_qkv_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v) {
  const HeadsLayout l = heads_layout({&q, &k, &v}, "merge_qkv_heads_bf16");
  Tensor qkv = Tensor::empty({l.batch, l.t, 3 * l.heads * l.d}, DType::BF16, q.device());
  const HeadPtrs<const float> in{{ptr<const float>(q), ptr<const float>(k), ptr<const float>(v)}};
  to_packed<std::uint16_t>(qkv, in, l, 3, "merge_qkv_heads_bf16");
  return qkv;
}

Tensor split_heads(const Tensor& x, std::int64_t heads) {
  const HeadsLayout l = packed_layout(x, 1, heads);
  Tensor y = Tensor::empty({l.batch, l.heads, l.t, l.d}, DType::F32, x.device());
  const HeadPtrs<float> out{{ptr<float>(y), nullptr, nullptr}};
  to_heads(x, out, l, 1, "split_heads");
  return y;
}

Tensor merge_heads(const Tensor& y) {
  const HeadsLayout l = heads_layout({&y}, "merge_heads");
  Tensor x = Tensor::empty({l.batch, l.t, l.heads * l.d}, DType::F32, y.device());
  const HeadPtrs<const float> in{{ptr<const float>(y), nullptr, nullptr}};
  to_packed(x, in, l, 1, "merge_heads");
  return x;
}

Tensor merge_heads_bf16(const Tensor& y, Tensor* y_bf16) {
  const HeadsLayout l = heads_layout({&y}, "merge_heads_bf16");
  Tensor x = Tensor::empty({l.batch, l.t, l.heads * l.d}, DType::BF16, y.device());
  std::uint16_t* yb = nullptr;
  if (y_bf16 != nullptr) {
    *y_bf16 = Tensor::empty(y.shape(), DType::BF16, y.device());
    yb = ptr<std::uint16_t>(*y_bf16);
  }
  const std::int64_t n = packed_numel(l, 1);
  if (n > 0) {
    to_packed_bf16_kernel<<<blocks_for(n, kThreads), kThreads, 0, current_stream()>>>(
        ptr<std::uint16_t>(x), ptr<const float>(y), yb, l, n);
    HPM_CUDA_LAUNCH_CHECK("merge_heads_bf16");
  }
  return x;
}

// ---- gather -----------------------------------------------------------------------------

Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices) {
  Shape s = x.shape();
  s[0] = static_cast<std::int64_t>(indices.size());  // a 0-d x throws here, as on the CPU
  // Every index checked before anything is issued; the first bad one is the CPU's error.
  for (const std::int64_t i : indices) {
    if (i < 0 || i >= x.size(0)) {
      throw std::out_of_range("index_select0: index " + std::to_string(i) + " out of range for " +
                              std::to_string(x.size(0)) + " rows");
    }
  }
  Tensor y = Tensor::empty(s, x.dtype(), x.device());
  const auto count = static_cast<std::int64_t>(indices.size());
  const std::int64_t row_bytes =
      x.shape().numel_from(1) * static_cast<std::int64_t>(dtype_size(x.dtype()));
  if (count == 0 || row_bytes == 0) return y;
  // The indices reach the device by Tensor::from_i64, whose copy is done with the host vector
  // when it returns and is ordered before this stream's later work.
  const Tensor idx = Tensor::from_i64(indices, Shape{count}, x.device());
  const void* px = device_ptr(x);
  void* py = device_ptr(y);
  const int unit =
      unit_bytes({static_cast<std::uint64_t>(row_bytes), reinterpret_cast<std::uintptr_t>(px),
                  reinterpret_cast<std::uintptr_t>(py)});
  const std::int64_t* pi = ptr<const std::int64_t>(idx);
  switch (unit) {
    case 16:
      launch_index_rows<uint4>(px, pi, py, count, row_bytes);
      break;
    case 8:
      launch_index_rows<std::uint64_t>(px, pi, py, count, row_bytes);
      break;
    case 4:
      launch_index_rows<std::uint32_t>(px, pi, py, count, row_bytes);
      break;
    case 2:
      launch_index_rows<std::uint16_t>(px, pi, py, count, row_bytes);
      break;
    default:
      launch_index_rows<std::uint8_t>(px, pi, py, count, row_bytes);
  }
  return y;
}

}  // namespace hpm::cuda
