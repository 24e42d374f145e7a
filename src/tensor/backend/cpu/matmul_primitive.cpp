#include "matmul_primitive.h"

#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "dnnl_context.h"

namespace hpm::cpu {

namespace {

using dnnl::memory;

struct Key {
  BatchedGemm g;
  int threads;
  auto operator<=>(const Key&) const = default;
};

struct Plan {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
  memory::desc a, b, c;
};

std::shared_ptr<const Plan> create_plan(const BatchedGemm& g) {
  const memory::data_type in = g.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  // Row-major operands as strided views: A (batch, m, k), B (batch, k, n), C (batch, m, n).
  const memory::desc a(
      {g.batch, g.m, g.k}, in,
      g.trans_a ? memory::dims{g.stride_a, 1, g.lda} : memory::dims{g.stride_a, g.lda, 1});
  const memory::desc b(
      {g.batch, g.k, g.n}, in,
      g.trans_b ? memory::dims{g.stride_b, 1, g.ldb} : memory::dims{g.stride_b, g.ldb, 1});
  const memory::desc c({g.batch, g.m, g.n},
                       g.c_bf16 ? memory::data_type::bf16 : memory::data_type::f32,
                       memory::dims{g.stride_c, g.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(g.beta);
    attr.set_post_ops(ops);
  }
  auto plan = std::make_shared<Plan>();
  plan->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  plan->matmul = dnnl::matmul(plan->pd);
  plan->a = a;
  plan->b = b;
  plan->c = c;
  return plan;
}

std::shared_ptr<const Plan> plan_for(const BatchedGemm& g) {
  cpu_engine();  // constructed before the cache, so destroyed after the primitives it holds
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Plan>> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = plans[Key{g, omp_get_max_threads()}];
  if (!slot) slot = create_plan(g);
  return slot;
}

void* scratchpad(std::size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

}  // namespace

void run_batched_gemm(const BatchedGemm& g, const void* a, const void* b, void* c) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  const auto plan = plan_for(g);
  dnnl::engine& engine = cpu_engine();
  // oneDNN's memory objects take non-const handles even for inputs it only reads.
  const memory ma(plan->a, engine, const_cast<void*>(a));
  const memory mb(plan->b, engine, const_cast<void*>(b));
  const memory mc(plan->c, engine, c);
  const memory::desc sd = plan->pd.scratchpad_desc();
  const memory ms(sd, engine, scratchpad(sd.get_size()));
  dnnl::stream& s = thread_stream();
  plan->matmul.execute(
      s,
      {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_SCRATCHPAD, ms}});
  s.wait();
}

std::string batched_gemm_implementation(const BatchedGemm& g) {
  return plan_for(g)->pd.impl_info_str();
}

}  // namespace hpm::cpu
