// Element-wise ops on the GPU: dtype conversions, fill, broadcast binary maps, the scalar and
// in-place updates, the unary activations and their gradients, where and masked fill. One
// thread per output element in grid-stride loops; broadcasting resolves each operand's offset
// from the flat output index over the shape with its size-1 dimensions dropped and its runs of
// mergeable dimensions coalesced (a bias row over a (N, C) matrix is a rank-2 problem whatever
// the rank of the tensors). The formulas are the CPU's (cpu/elementwise.cpp, cpu/bf16.cpp),
// including its exp and erf approximations (cpu/vec.h), so that both backends agree to float
// rounding and at the edges (exp's flush to 0 below -86.6, the NaN bits of a rounding). The
// activations' kernels are unary_kernels.cuh's.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/cast_many_kernels.cuh"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/runtime.h"
#include "tensor/backend/cuda/unary_kernels.cuh"

namespace hpm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxDims = 8;

// The threads of unary_kernels.cuh's kernels over n elements: a thread for two 8-element groups,
// or with HPM_CUDA_UNARY_PAIRS=0 (the A/B) for one, as before run 13.
std::int64_t unary_threads(std::int64_t n) {
  static const bool pairs = ab_switch_on("HPM_CUDA_UNARY_PAIRS");
  return pairs ? (n + 15) / 16 : (n + 7) / 8;
}

// Launches kernel over n elements (nothing for none) and checks the launch.
template <typename... Params, typename... Args>
void launch(const char* name, std::int64_t n, void (*kernel)(Params...), Args&&... args) {
  if (n <= 0) return;
  kernel<<<blocks_for(n, kThreads), kThreads, 0, current_stream()>>>(std::forward<Args>(args)...);
  HPM_CUDA_LAUNCH_CHECK(name);
}

// ---- bit-exact conversions (cpu/bf16.cpp's, usable on both sides) -----------------------------

__host__ __device__ inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
__host__ __device__ inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

__device__ inline float bf16_bits_to_f32(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

// IEEE binary16 <-> binary32 as the CPU does it (exact widening with NaN payloads kept;
// narrowing to nearest even, overflow to infinity, a quiet NaN keeping its sign), rather than
// cuda_fp16's intrinsics, whose NaN is canonical: the same bits on both backends.
__host__ __device__ inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);
  const float v = static_cast<float>(mant) * 0x1p-24f;  // subnormal: exact in f32
  return bits_float(float_bits(v) | sign);
}

__host__ __device__ inline std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    // Below the smallest normal half: the float addition rounds to the 2^-24 unit.
    const float r = bits_float(abs) + 0.5f;
    return static_cast<std::uint16_t>(sign | (float_bits(r) - 0x3f000000u));
  }
  const std::uint32_t mant_odd = (abs >> 13) & 1u;
  const std::uint32_t rounded = abs + 0xfffu + mant_odd;
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

// A source element as f32, whatever floating dtype holds it (16-bit types as their bits).
template <DType D>
__device__ inline float load_as_f32(const void* p, std::int64_t i) {
  if constexpr (D == DType::F32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (D == DType::F64) {
    return static_cast<float>(static_cast<const double*>(p)[i]);  // to nearest, as the CPU
  } else if constexpr (D == DType::BF16) {
    return bf16_bits_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  } else {
    static_assert(D == DType::F16);
    return f16_bits_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  }
}

// Eight elements a thread where both are 16-byte aligned (launched over ceil(n / 8) threads), the
// rest one by one: autocast's weight copies, run 6's to_bf16 (3% of GPT-2's step).
__global__ void f32_to_bf16_kernel(const float* x, std::uint16_t* y, std::int64_t n) {
  const std::int64_t groups = aligned16(x) && aligned16(y) ? n / 8 : 0;
  for (std::int64_t g = first_index(); g < groups; g += grid_stride()) {
    float v[8];
    load8(x + 8 * g, v);
    store8(y + 8 * g, v);
  }
  for (std::int64_t i = 8 * groups + first_index(); i < n; i += grid_stride()) {
    y[i] = f32_to_bf16_bits(x[i]);
  }
}

template <DType D>
__global__ void to_f32_kernel(const void* x, float* y, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = load_as_f32<D>(x, i);
}

// F64 goes through f32 first, as the CPU's to_f16 does (to_f32, then narrowing).
template <DType D>
__global__ void to_f16_kernel(const void* x, std::uint16_t* y, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    y[i] = f32_to_f16_bits(load_as_f32<D>(x, i));
  }
}

// Every element set to the same bit pattern, of the element's width.
template <typename Bits>
__global__ void fill_kernel(Bits* x, Bits value, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) x[i] = value;
}

template <typename Bits>
void fill_bits(Tensor& x, Bits value) {
  launch("fill_", x.numel(), fill_kernel<Bits>, ptr<Bits>(x), value, x.numel());
}

// ---- broadcasting ---------------------------------------------------------------------------

// Offsets of N operands at each element of a broadcast output: the output's dimensions (size-1
// ones dropped, mergeable neighbours coalesced) and each operand's strides along them (0 where it
// is broadcast). `contiguous`: every operand is the output's own shape, so its offset is the flat
// index (the common case, with no division).
template <int N>
struct Indexer {
  int rank = 0;
  bool contiguous = true;
  std::int64_t dims[kMaxDims] = {};
  std::int64_t strides[N][kMaxDims] = {};

  __device__ void offsets(std::int64_t flat, std::int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = contiguous ? flat : 0;
    if (contiguous) return;
    for (int d = rank - 1; d >= 0; --d) {
      const std::int64_t i = flat % dims[d];
      flat /= dims[d];
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

// The strides of `s` seen from the broadcast shape `out` (cpu/broadcast.h's broadcast_strides).
std::vector<std::int64_t> broadcast_strides(const Shape& s, const Shape& out) {
  std::vector<std::int64_t> st(static_cast<std::size_t>(out.rank()), 0);
  std::int64_t stride = 1;
  for (int i = s.rank() - 1, j = out.rank() - 1; i >= 0; --i, --j) {
    st[static_cast<std::size_t>(j)] = s[i] == 1 ? 0 : stride;
    stride *= s[i];
  }
  return st;
}

// Operands' shapes must broadcast to `out` (the callers computed `out` from them).
template <int N>
Indexer<N> make_indexer(const Shape& out, const Shape* const (&shapes)[N], const char* what) {
  std::vector<std::int64_t> st[N];
  for (int k = 0; k < N; ++k) st[k] = broadcast_strides(*shapes[k], out);
  Indexer<N> ix;
  for (int d = 0; d < out.rank(); ++d) {
    const std::int64_t size = out[d];
    if (size == 1) continue;  // contributes nothing to any offset
    const auto du = static_cast<std::size_t>(d);
    // Merge with the previous kept dimension when, for every operand, stepping it once is
    // stepping this one `size` times: (i, j) -> i * size + j along one dimension.
    bool merge = ix.rank > 0;
    for (int k = 0; merge && k < N; ++k) merge = ix.strides[k][ix.rank - 1] == st[k][du] * size;
    if (merge) {
      ix.dims[ix.rank - 1] *= size;
      for (int k = 0; k < N; ++k) ix.strides[k][ix.rank - 1] = st[k][du];
      continue;
    }
    if (ix.rank == kMaxDims) {
      throw std::invalid_argument(std::string(what) + ": broadcasting " + out.str() +
                                  " needs more than 8 dimensions");
    }
    ix.dims[ix.rank] = size;
    for (int k = 0; k < N; ++k) ix.strides[k][ix.rank] = st[k][du];
    ++ix.rank;
  }
  // Contiguous: at most one dimension left, and every operand walks it with stride 1 (or there
  // is only one element).
  ix.contiguous = ix.rank == 0;
  if (ix.rank == 1) {
    ix.contiguous = true;
    for (int k = 0; k < N; ++k) ix.contiguous = ix.contiguous && ix.strides[k][0] == 1;
  }
  return ix;
}

// ---- the maps ---------------------------------------------------------------------------

template <BinaryOp Op>
__device__ inline float apply_binary(float u, float v) {
  if constexpr (Op == BinaryOp::Add) return u + v;
  if constexpr (Op == BinaryOp::Sub) return u - v;
  if constexpr (Op == BinaryOp::Mul) return u * v;
  if constexpr (Op == BinaryOp::Div) return u / v;
  return 0.0f;
}

template <BinaryOp Op>
__global__ void binary_kernel(const float* a, const float* b, float* y, std::int64_t n,
                              Indexer<2> ix) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[2];
    ix.offsets(i, off);
    y[i] = apply_binary<Op>(a[off[0]], b[off[1]]);
  }
}

// a and b of y's shape (no broadcast): eight elements a thread where all three are 16-byte
// aligned, as f32_to_bf16_kernel (the backward's gradient sums, run 6's binary add).
template <BinaryOp Op>
__global__ void binary_same_kernel(const float* a, const float* b, float* y, std::int64_t n) {
  const std::int64_t groups = aligned16(a) && aligned16(b) && aligned16(y) ? n / 8 : 0;
  for (std::int64_t g = first_index(); g < groups; g += grid_stride()) {
    float u[8], v[8];
    load8(a + 8 * g, u);
    load8(b + 8 * g, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) u[k] = apply_binary<Op>(u[k], v[k]);
    store8(y + 8 * g, u);
  }
  for (std::int64_t i = 8 * groups + first_index(); i < n; i += grid_stride()) {
    y[i] = apply_binary<Op>(a[i], b[i]);
  }
}

__global__ void add_scalar_kernel(const float* a, float s, float* y, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] + s;
}
__global__ void add_scalar_i64_kernel(const std::int64_t* a, std::int64_t s, std::int64_t* y,
                                      std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] + s;
}
__global__ void mul_scalar_kernel(const float* a, float s, float* y, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] = a[i] * s;
}
__global__ void axpy_kernel(float* y, float alpha, const float* x, std::int64_t n) {
  // Rounded twice, as the CPU's loop (nvcc would contract the two into one FMA).
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    y[i] = __fadd_rn(y[i], __fmul_rn(alpha, x[i]));
  }
}
__global__ void scale_kernel(float* y, float alpha, std::int64_t n) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) y[i] *= alpha;
}
// y *= *s for F32 y or BF16 y (T its bits, rounded back as f32_to_bf16_kernel rounds); nothing
// at all where *s is exactly 1, which every thread reads first: the host never waits for s.
template <typename T>
__global__ void scale_by_kernel(T* y, const float* s, std::int64_t n) {
  const float a = *s;
  if (a == 1.0f) return;
  const std::int64_t groups = aligned16(y) ? n / 8 : 0;
  for (std::int64_t g = first_index(); g < groups; g += grid_stride()) {
    float v[8];
    load8(y + 8 * g, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] *= a;
    store8(y + 8 * g, v);
  }
  for (std::int64_t i = 8 * groups + first_index(); i < n; i += grid_stride()) {
    if constexpr (std::is_same_v<T, float>) {
      y[i] *= a;
    } else {
      y[i] = f32_to_bf16_bits(as_f32(y[i]) * a);
    }
  }
}

template <typename F>
void with_binary_op(BinaryOp op, F&& f) {
  using enum BinaryOp;
  switch (op) {
    case Add:
      return f(std::integral_constant<BinaryOp, Add>{});
    case Sub:
      return f(std::integral_constant<BinaryOp, Sub>{});
    case Mul:
      return f(std::integral_constant<BinaryOp, Mul>{});
    case Div:
      return f(std::integral_constant<BinaryOp, Div>{});
  }
  throw std::logic_error("unknown binary op");
}

template <typename F>
void with_unary_op(UnaryOp op, F&& f) {
  using enum UnaryOp;
  switch (op) {
    case Neg:
      return f(std::integral_constant<UnaryOp, Neg>{});
    case Exp:
      return f(std::integral_constant<UnaryOp, Exp>{});
    case Log:
      return f(std::integral_constant<UnaryOp, Log>{});
    case Sqrt:
      return f(std::integral_constant<UnaryOp, Sqrt>{});
    case Relu:
      return f(std::integral_constant<UnaryOp, Relu>{});
    case Tanh:
      return f(std::integral_constant<UnaryOp, Tanh>{});
    case Sigmoid:
      return f(std::integral_constant<UnaryOp, Sigmoid>{});
    case Gelu:
      return f(std::integral_constant<UnaryOp, Gelu>{});
    case GeluTanh:
      return f(std::integral_constant<UnaryOp, GeluTanh>{});
    case Square:
      return f(std::integral_constant<UnaryOp, Square>{});
  }
  throw std::logic_error("unknown unary op");
}

__global__ void where_kernel(const std::int8_t* cond, const float* a, const float* b, float* y,
                             std::int64_t n, Indexer<3> ix) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[3];
    ix.offsets(i, off);
    y[i] = cond[off[0]] != 0 ? a[off[1]] : b[off[2]];
  }
}

// y = x where the mask (broadcast to x) is false, `value` where it is true.
__global__ void masked_fill_kernel(const float* x, const std::int8_t* mask, float value, float* y,
                                   std::int64_t n, Indexer<1> ix) {
  for (std::int64_t i = first_index(); i < n; i += grid_stride()) {
    std::int64_t off[1];
    ix.offsets(i, off);
    y[i] = mask[off[0]] != 0 ? value : x[i];
  }
}

void check_mask(const Tensor& mask, const char* what) {
  if (mask.dtype() != DType::I8) {
    throw std::invalid_argument(std::string(what) + ": the mask must be I8 (0 or 1), got " +
                                dtype_name(mask.dtype()));
  }
}

// For unary_backward: an operand the formula reads must cover grad_y's elements (the CPU reads
// it unchecked).
void check_operand(const Tensor& t, const Tensor& grad_y, const char* name) {
  require_dtype(t, DType::F32);
  if (t.numel() != grad_y.numel()) {
    throw std::invalid_argument(std::string("unary_backward: ") + name + " " + t.shape().str() +
                                " beside grad_y " + grad_y.shape().str());
  }
}

}  // namespace

// ---- conversions --------------------------------------------------------------------------

Tensor to_bf16(const Tensor& x) {
  if (x.dtype() == DType::BF16) return x;
  require_dtype(x, DType::F32);
  Tensor y = Tensor::empty(x.shape(), DType::BF16, x.device());
  launch("to_bf16", (x.numel() + 7) / 8, f32_to_bf16_kernel, ptr<const float>(x),
         ptr<std::uint16_t>(y), x.numel());
  return y;
}

std::vector<Tensor> to_bf16_many(const std::vector<Tensor>& xs) {
  std::vector<Tensor> ys;
  ys.reserve(xs.size());
  CastPacker packer;
  const auto launch_list = [](const CastList& l, unsigned blocks) {
    f32_to_bf16_many_kernel<<<blocks, kThreads, 0, current_stream()>>>(l);
    HPM_CUDA_LAUNCH_CHECK("f32_to_bf16_many_kernel");
  };
  for (const Tensor& x : xs) {
    if (x.dtype() == DType::BF16) {  // as to_bf16: itself
      ys.push_back(x);
      continue;
    }
    require_dtype(x, DType::F32);
    ys.push_back(Tensor::empty(x.shape(), DType::BF16, x.device()));
    packer.add(ptr<const float>(x), ptr<std::uint16_t>(ys.back()), x.numel(), launch_list);
  }
  packer.flush(launch_list);
  return ys;
}

Tensor to_f32(const Tensor& x) {
  if (x.dtype() == DType::F32) return x;
  const std::int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::BF16: {
      Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
      launch("to_f32", n, to_f32_kernel<DType::BF16>, device_ptr(x), ptr<float>(y), n);
      return y;
    }
    case DType::F16: {
      Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
      launch("to_f32", n, to_f32_kernel<DType::F16>, device_ptr(x), ptr<float>(y), n);
      return y;
    }
    case DType::F64: {
      Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
      launch("to_f32", n, to_f32_kernel<DType::F64>, device_ptr(x), ptr<float>(y), n);
      return y;
    }
    default:
      throw std::invalid_argument(std::string("to_f32: expected a floating-point tensor, got ") +
                                  dtype_name(x.dtype()));
  }
}

Tensor to_f16(const Tensor& x) {
  if (x.dtype() == DType::F16) return x;
  const std::int64_t n = x.numel();
  auto convert = [&](auto kernel) {
    Tensor y = Tensor::empty(x.shape(), DType::F16, x.device());
    launch("to_f16", n, kernel, device_ptr(x), ptr<std::uint16_t>(y), n);
    return y;
  };
  switch (x.dtype()) {
    case DType::F32:
      return convert(to_f16_kernel<DType::F32>);
    case DType::BF16:
      return convert(to_f16_kernel<DType::BF16>);
    case DType::F64:
      return convert(to_f16_kernel<DType::F64>);
    default:  // the CPU's to_f16 goes through to_f32, which rejects the rest so
      throw std::invalid_argument(std::string("to_f32: expected a floating-point tensor, got ") +
                                  dtype_name(x.dtype()));
  }
}

void fill_(Tensor& x, float value) {
  if (x.numel() == 0) return;
  if (value == 0.0f) {  // every dtype's zero is all zero bits (the CPU memsets too)
    HPM_CUDA_CHECK(cudaMemsetAsync(device_ptr(x), 0, x.nbytes(), current_stream()));
    return;
  }
  // The value converted on the host exactly as the CPU's fill_ converts it, then stored as bits.
  switch (x.dtype()) {
    case DType::F32:
      return fill_bits<std::uint32_t>(x, float_bits(value));
    case DType::I64:
      return fill_bits<std::uint64_t>(x,
                                      static_cast<std::uint64_t>(static_cast<std::int64_t>(value)));
    case DType::I32:
      return fill_bits<std::uint32_t>(x,
                                      static_cast<std::uint32_t>(static_cast<std::int32_t>(value)));
    case DType::I8:
      return fill_bits<std::uint8_t>(x, static_cast<std::uint8_t>(static_cast<std::int8_t>(value)));
    case DType::U8:
      return fill_bits<std::uint8_t>(x, static_cast<std::uint8_t>(value));
    case DType::F64: {
      const double d = value;
      std::uint64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      return fill_bits<std::uint64_t>(x, bits);
    }
    case DType::BF16:
      return fill_bits<std::uint16_t>(x, f32_to_bf16_bits(value));
    case DType::F16:
      return fill_bits<std::uint16_t>(x, f32_to_f16_bits(value));
  }
}

// ---- element-wise maps --------------------------------------------------------------------

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  require_dtype(a, DType::F32);
  require_dtype(b, DType::F32);
  const Shape out = a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape());
  const Shape* shapes[2] = {&a.shape(), &b.shape()};
  const Indexer<2> ix = make_indexer(out, shapes, "binary");
  Tensor y = Tensor::empty(out, DType::F32, a.device());
  const std::int64_t n = out.numel();
  const float* pa = ptr<const float>(a);
  const float* pb = ptr<const float>(b);
  float* py = ptr<float>(y);
  with_binary_op(op, [&](auto kop) {
    constexpr BinaryOp kOp = decltype(kop)::value;
    if (a.shape() == b.shape()) {  // eight elements a thread (binary_same_kernel)
      launch("binary", (n + 7) / 8, binary_same_kernel<kOp>, pa, pb, py, n);
    } else {
      launch("binary", n, binary_kernel<kOp>, pa, pb, py, n, ix);
    }
  });
  return y;
}

Tensor add_scalar(const Tensor& a, float s) {
  const std::int64_t n = a.numel();
  if (a.dtype() == DType::I64) {  // counters (BatchNorm's batch count), as the CPU backend
    Tensor y = Tensor::empty(a.shape(), DType::I64, a.device());
    launch("add_scalar", n, add_scalar_i64_kernel, ptr<const std::int64_t>(a),
           static_cast<std::int64_t>(s), ptr<std::int64_t>(y), n);
    return y;
  }
  require_dtype(a, DType::F32);
  Tensor y = Tensor::empty(a.shape(), DType::F32, a.device());
  launch("add_scalar", n, add_scalar_kernel, ptr<const float>(a), s, ptr<float>(y), n);
  return y;
}

Tensor mul_scalar(const Tensor& a, float s) {
  require_dtype(a, DType::F32);
  const std::int64_t n = a.numel();
  Tensor y = Tensor::empty(a.shape(), DType::F32, a.device());
  launch("mul_scalar", n, mul_scalar_kernel, ptr<const float>(a), s, ptr<float>(y), n);
  return y;
}

void axpy_(Tensor& y, float alpha, const Tensor& x) {
  if (y.numel() != x.numel()) {
    throw std::invalid_argument("axpy_: " + y.shape().str() + " += " + x.shape().str());
  }
  require_dtype(y, DType::F32);
  require_dtype(x, DType::F32);
  launch("axpy_", y.numel(), axpy_kernel, ptr<float>(y), alpha, ptr<const float>(x), y.numel());
}

void scale_(Tensor& y, float alpha) {
  require_dtype(y, DType::F32);
  launch("scale_", y.numel(), scale_kernel, ptr<float>(y), alpha, y.numel());
}

void scale_by_(Tensor& y, const Tensor& s) {  // operands checked by the dispatch
  const std::int64_t n = y.numel();
  if (n == 0) return;
  // A grid of at most a few blocks an SM, striding over y: where s is 1 (a loss's gradient, as a
  // rule) the launch costs the blocks' one read of it, not a block per 2,048 elements.
  constexpr std::int64_t kMostBlocks = 1024;
  const unsigned blocks =
      grid_for(std::min<std::int64_t>(kMostBlocks, (n + 8 * kThreads - 1) / (8 * kThreads)));
  if (y.dtype() == DType::BF16) {
    scale_by_kernel<<<blocks, kThreads, 0, current_stream()>>>(ptr<std::uint16_t>(y),
                                                               ptr<const float>(s), n);
  } else {
    scale_by_kernel<<<blocks, kThreads, 0, current_stream()>>>(ptr<float>(y), ptr<const float>(s),
                                                               n);
  }
  HPM_CUDA_LAUNCH_CHECK("scale_by_");
}

Tensor unary(UnaryOp op, const Tensor& x) {
  require_dtype(x, DType::F32);
  const std::int64_t n = x.numel();
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  with_unary_op(op, [&](auto kop) {
    launch("unary", n, unary_kernel<decltype(kop)::value>, ptr<const float>(x), ptr<float>(y), n);
  });
  return y;
}

Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16) {
  const bool bf16_x = x.dtype() == DType::BF16;
  if (!bf16_x) require_dtype(x, DType::F32);
  const std::int64_t n = x.numel();
  Tensor y = Tensor::empty(x.shape(), DType::BF16, x.device());
  std::uint16_t* xb = nullptr;
  if (x_bf16 != nullptr && bf16_x) {
    *x_bf16 = x;  // already its own bf16 copy
  } else if (x_bf16 != nullptr) {
    *x_bf16 = Tensor::empty(x.shape(), DType::BF16, x.device());
    xb = ptr<std::uint16_t>(*x_bf16);
  }
  with_unary_op(op, [&](auto kop) {
    constexpr UnaryOp kOp = decltype(kop)::value;
    if (bf16_x) {
      launch("unary_bf16", unary_threads(n), unary_bf16_kernel<kOp, std::uint16_t>,
             ptr<const std::uint16_t>(x), ptr<std::uint16_t>(y), nullptr, n);
    } else {
      launch("unary_bf16", unary_threads(n), unary_bf16_kernel<kOp, float>, ptr<const float>(x),
             ptr<std::uint16_t>(y), xb, n);
    }
  });
  return y;
}

namespace {

// unary_backward's checks and launch, the result F32 or rounded to BF16 (Out float or its bits).
template <typename Out>
Tensor run_unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y) {
  // A BF16 grad_y comes with a BF16 x (a bf16 product's input gradient, its activation's input).
  const bool bf16_g = grad_y.dtype() == DType::BF16;
  if (!bf16_g) require_dtype(grad_y, DType::F32);
  // Relu reads only y and Gelu only x, which must be there; the other formulas read whichever
  // of x and y is defined and take 0 for the other, as the CPU's ternary map does.
  if (op == UnaryOp::Relu && !y.defined()) {
    throw std::invalid_argument("unary_backward: Relu's gradient needs its output y");
  }
  if (op == UnaryOp::Gelu && !x.defined()) {
    throw std::invalid_argument("unary_backward: Gelu's gradient needs its input x");
  }
  const bool reads_x = x.defined() && op != UnaryOp::Relu;
  const bool reads_y = y.defined() && op != UnaryOp::Gelu;
  const bool x_bf16 = reads_x && x.dtype() == DType::BF16;
  if (reads_x && !x_bf16) check_operand(x, grad_y, "x");
  if (x_bf16 && x.numel() != grad_y.numel()) {
    throw std::invalid_argument("unary_backward: x " + x.shape().str() + " beside grad_y " +
                                grad_y.shape().str());
  }
  if (reads_y) check_operand(y, grad_y, "y");
  if (bf16_g && (!x_bf16 || reads_y)) {
    throw std::invalid_argument(
        "unary_backward: a BF16 grad_y needs a BF16 x and no y (a bf16 product's activation)");
  }
  const std::int64_t n = grad_y.numel();
  constexpr bool kBf16 = std::is_same_v<Out, std::uint16_t>;
  Tensor out = Tensor::empty(grad_y.shape(), kBf16 ? DType::BF16 : DType::F32, grad_y.device());
  const float* py = reads_y ? ptr<const float>(y) : nullptr;
  with_unary_op(op, [&](auto kop) {
    constexpr UnaryOp kOp = decltype(kop)::value;
    if (bf16_g) {
      launch("unary_backward", unary_threads(n),
             unary_backward_kernel<kOp, std::uint16_t, std::uint16_t, Out>,
             ptr<const std::uint16_t>(grad_y), ptr<const std::uint16_t>(x), nullptr, ptr<Out>(out),
             n);
    } else if (x_bf16) {
      launch("unary_backward", unary_threads(n),
             unary_backward_kernel<kOp, float, std::uint16_t, Out>, ptr<const float>(grad_y),
             ptr<const std::uint16_t>(x), py, ptr<Out>(out), n);
    } else {
      launch("unary_backward", unary_threads(n), unary_backward_kernel<kOp, float, float, Out>,
             ptr<const float>(grad_y), reads_x ? ptr<const float>(x) : nullptr, py, ptr<Out>(out),
             n);
    }
  });
  return out;
}

}  // namespace

Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y) {
  return run_unary_backward<float>(op, grad_y, x, y);
}

Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y) {
  return run_unary_backward<std::uint16_t>(op, grad_y, x, y);
}

// ---- selection ----------------------------------------------------------------------------

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_mask(cond, "where");
  const Shape out = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape()));
  require_dtype(a, DType::F32);
  require_dtype(b, DType::F32);
  const Shape* shapes[3] = {&cond.shape(), &a.shape(), &b.shape()};
  const Indexer<3> ix = make_indexer(out, shapes, "where");
  Tensor y = Tensor::empty(out, DType::F32, a.device());
  const std::int64_t n = out.numel();
  launch("where", n, where_kernel, ptr<const std::int8_t>(cond), ptr<const float>(a),
         ptr<const float>(b), ptr<float>(y), n, ix);
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) {
  check_mask(mask, "masked_fill");
  if (broadcast_shapes(x.shape(), mask.shape()) != x.shape()) {
    throw std::invalid_argument("masked_fill: mask " + mask.shape().str() +
                                " does not broadcast to " + x.shape().str());
  }
  require_dtype(x, DType::F32);
  const Shape* shapes[1] = {&mask.shape()};
  const Indexer<1> ix = make_indexer(x.shape(), shapes, "masked_fill");
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const std::int64_t n = x.numel();
  launch("masked_fill", n, masked_fill_kernel, ptr<const float>(x), ptr<const std::int8_t>(mask),
         value, ptr<float>(y), n, ix);
  return y;
}

}  // namespace hpm::cuda
