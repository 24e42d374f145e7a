// bfloat16: conversions, and GEMMs with bf16 inputs accumulating in f32 on oneDNN's matmul
// primitive (on AVX512_BF16, its brgemm kernels: vdpbf16ps, twice the f32 FMA rate per cycle).
//
// A primitive is created and JIT-compiled once per problem (shapes, transposes, leading
// dimensions, alpha, beta, thread count: oneDNN fixes a primitive's thread split when it is
// created) and cached; a GPT step has about a dozen. Each call brings its own scratchpad
// (scratchpad_mode::user, a per-thread buffer), so replicas on several threads may run one
// primitive at once.
#include <omp.h>

#include <bit>
#include <compare>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <vector>

#include "dnnl_context.h"
#include "hpm/tensor/kernels.h"
#include "linear_output.h"
#include "parallel.h"
#include "vec.h"

namespace hpm::kernels {

namespace {

using dnnl::memory;

// Round to nearest even, NaN kept a (quiet) NaN: what oneDNN, PyTorch and vcvtneps2bf16 do.
HPM_SIMD_CLONES void f32_to_bf16_span(const float* x, std::uint16_t* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = std::bit_cast<std::uint32_t>(x[i]);
    const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    y[i] = static_cast<std::uint16_t>(nan ? (u >> 16) | 0x40u : rounded >> 16);
  }
}

HPM_SIMD_CLONES void bf16_to_f32_span(const std::uint16_t* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(std::uint32_t{x[i]} << 16);
}

struct GemmKey {
  bool trans_a, trans_b;
  std::int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  int threads;
  auto operator<=>(const GemmKey&) const = default;
};

struct GemmPlan {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
  memory::desc a, b, c;
};

std::shared_ptr<const GemmPlan> create_plan(const GemmKey& key) {
  // Row-major operands as strided views: A (m, k), B (k, n), C (m, n).
  const memory::desc a({key.m, key.k}, memory::data_type::bf16,
                       key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  const memory::desc b({key.k, key.n}, memory::data_type::bf16,
                       key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  const memory::desc c({key.m, key.n}, memory::data_type::f32, memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  auto plan = std::make_shared<GemmPlan>();
  plan->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  plan->matmul = dnnl::matmul(plan->pd);
  plan->a = a;
  plan->b = b;
  plan->c = c;
  return plan;
}

std::shared_ptr<const GemmPlan> plan_for(const GemmKey& key) {
  static std::mutex mu;
  static std::map<GemmKey, std::shared_ptr<const GemmPlan>> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = plans[key];
  if (!slot) slot = create_plan(key);
  return slot;
}

void* scratchpad(std::size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

void check_bf16(const Tensor& t, const char* what) {
  if (t.dtype() != DType::BF16 || t.dim() != 2) {
    throw std::invalid_argument(std::string(what) + ": expected a 2-D BF16 tensor, got " +
                                dtype_name(t.dtype()) + " " + t.shape().str());
  }
}

}  // namespace

bool native_bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

Tensor to_bf16(const Tensor& x) {
  if (x.dtype() == DType::BF16) return x;
  Tensor y = Tensor::empty(x.shape(), DType::BF16, x.device());
  const float* px = x.data<float>();
  auto* py = y.data<std::uint16_t>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    f32_to_bf16_span(px + lo, py + lo, hi - lo);
  });
  return y;
}

Tensor to_f32(const Tensor& x) {
  if (x.dtype() == DType::F32) return x;
  if (x.dtype() != DType::BF16) {
    throw std::invalid_argument(std::string("to_f32: expected BF16 or F32, got ") +
                                dtype_name(x.dtype()));
  }
  Tensor y = Tensor::empty(x.shape(), DType::F32, x.device());
  const auto* px = x.data<std::uint16_t>();
  float* py = y.data<float>();
  parallel_for(x.numel(), kElementwiseGrain, [&](std::int64_t lo, std::int64_t hi) {
    bf16_to_f32_span(px + lo, py + lo, hi - lo);
  });
  return y;
}

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
               std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  const GemmKey key{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, omp_get_max_threads()};
  const auto plan = plan_for(key);
  dnnl::engine& engine = cpu_engine();
  const memory ma(plan->a, engine, const_cast<std::uint16_t*>(a));
  const memory mb(plan->b, engine, const_cast<std::uint16_t*>(b));
  const memory mc(plan->c, engine, c);
  const memory::desc sd = plan->pd.scratchpad_desc();
  const memory ms(sd, engine, scratchpad(sd.get_size()));
  plan->matmul.execute(
      thread_stream(),
      {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}});
  thread_stream().wait();
}

std::string gemm_bf16_implementation(std::int64_t m, std::int64_t n, std::int64_t k) {
  const GemmKey key{false, false, m, n, k, k, n, n, 1.0f, 0.0f, omp_get_max_threads()};
  return plan_for(key)->pd.impl_info_str();
}

Tensor matmul_bf16(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  check_bf16(a, "matmul_bf16");
  check_bf16(b, "matmul_bf16");
  const std::int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
  const std::int64_t kb = trans_b ? b.size(1) : b.size(0), n = trans_b ? b.size(0) : b.size(1);
  if (k != kb) {
    throw std::invalid_argument("matmul_bf16: inner dimensions differ: " + a.shape().str() +
                                (trans_a ? "^T" : "") + " x " + b.shape().str() +
                                (trans_b ? "^T" : ""));
  }
  Tensor c = Tensor::empty({m, n}, DType::F32, a.device());
  gemm_bf16(trans_a, trans_b, m, n, k, 1.0f, a.data<std::uint16_t>(), a.size(1),
            b.data<std::uint16_t>(), b.size(1), 0.0f, c.data<float>(), n);
  return c;
}

Tensor linear_bf16(const Tensor& x, const Tensor& w, const Tensor& bias) {
  check_bf16(x, "linear_bf16");
  check_bf16(w, "linear_bf16");
  LinearOutput o = linear_output(x, w, bias);
  gemm_bf16(false, true, x.size(0), w.size(0), x.size(1), 1.0f, x.data<std::uint16_t>(), x.size(1),
            w.data<std::uint16_t>(), w.size(1), o.beta, o.y.data<float>(), w.size(0));
  return o.y;
}

}  // namespace hpm::kernels
