// Optimizer updates (Adam(W), SGD): element-wise over a parameter and its state, in place. The
// formulas and their order are optimizer_updates.cpp's; the products and sums use the _rn
// intrinsics so that nvcc does not contract them into FMAs: the roundings of the CPU's baseline
// code (its Adam clones for FMA-capable CPUs contract some: a unit in the last place apart, as
// tests/cuda_emulated/optimizer_test.cpp measures). The kernels are optimizer_kernels.cuh's.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor/backend/cuda/deferred_checks.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/optimizer_kernels.cuh"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

void adam_step_(const kernels::AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                Tensor& vmax) {
  // cpu_backend.cpp's checks, in its order.
  const std::int64_t n = p.numel();
  for (const Tensor* t : {&g, static_cast<const Tensor*>(&m), static_cast<const Tensor*>(&v)}) {
    if (t->numel() != n) throw std::invalid_argument("adam_step_: state of another size");
  }
  if (vmax.defined() && vmax.numel() != n) {
    throw std::invalid_argument("adam_step_: vmax of another size");
  }
  for (const Tensor* t : {static_cast<const Tensor*>(&p), &g, static_cast<const Tensor*>(&m),
                          static_cast<const Tensor*>(&v)}) {
    require_dtype(*t, DType::F32);
  }
  if (vmax.defined()) require_dtype(vmax, DType::F32);
  if (n == 0) return;
  adam_kernel<<<blocks_for(n), 256, 0, current_stream()>>>(
      s, ptr<float>(p), ptr<float>(g), ptr<float>(m), ptr<float>(v),
      vmax.defined() ? ptr<float>(vmax) : nullptr, n);
  HPM_CUDA_LAUNCH_CHECK("adam_kernel");
}

void halt_unless_finite_(Tensor& halted, const Tensor& value) {
  Context& c = current_context();
  GateChecks checks{};
  static_assert(sizeof(checks.word) / sizeof(int) == Context::kMaxChecks);
  for (const CheckRef& r : checks_of_this_thread(c)) checks.word[checks.count++] = r.word;
  halt_unless_finite_kernel<<<1, 1, 0, c.compute>>>(ptr<int>(halted), ptr<float>(value),
                                                    c.check_words, checks);
  HPM_CUDA_LAUNCH_CHECK("halt_unless_finite_kernel");
}

void adam_step_multi_(const kernels::AdamStep& s, const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                      const std::vector<Tensor>& exp_avg_sq,
                      const std::vector<Tensor>& max_exp_avg_sq, const Tensor& grad_norm_sq,
                      float max_norm, const Tensor& halted) {
  const double* norm_sq = nullptr;
  if (grad_norm_sq.defined() && max_norm > 0.0f) {
    require_dtype(grad_norm_sq, DType::F64);
    if (grad_norm_sq.numel() != 1) {
      throw std::invalid_argument("adam_step_multi_: grad_norm_sq must be one F64 value");
    }
    norm_sq = ptr<double>(grad_norm_sq);
  }
  int* halted_flag = nullptr;
  if (halted.defined()) {
    require_dtype(halted, DType::I32);
    halted_flag = ptr<int>(halted);
  }
  const bool ams = !max_exp_avg_sq.empty();
  const auto launch = [&](const AdamList& l, unsigned blocks) {
    adam_multi_kernel<<<blocks, 256, 0, current_stream()>>>(s, l, norm_sq, max_norm, halted_flag);
    HPM_CUDA_LAUNCH_CHECK("adam_multi_kernel");
  };
  AdamPacker packer;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const std::int64_t n = p.numel();
    for (const Tensor* t : {&grads[i], &exp_avg[i], &exp_avg_sq[i]}) {
      if (t->numel() != n) throw std::invalid_argument("adam_step_multi_: state of another size");
    }
    if (ams && max_exp_avg_sq[i].numel() != n) {
      throw std::invalid_argument("adam_step_multi_: vmax of another size");
    }
    for (const Tensor* t : {&p, &grads[i], &exp_avg[i], &exp_avg_sq[i]})
      require_dtype(*t, DType::F32);
    if (ams) require_dtype(max_exp_avg_sq[i], DType::F32);
    packer.add(ptr<float>(p), ptr<float>(grads[i]), ptr<float>(exp_avg[i]),
               ptr<float>(exp_avg_sq[i]), ams ? ptr<float>(max_exp_avg_sq[i]) : nullptr, n, launch);
  }
  packer.flush(launch);
}

void sgd_step_(const kernels::SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf) {
  const std::int64_t n = p.numel();
  if (g.numel() != n || (buf.defined() && buf.numel() != n)) {
    throw std::invalid_argument("sgd_step_: state of another size");
  }
  require_dtype(p, DType::F32);
  require_dtype(g, DType::F32);
  if (buf.defined()) require_dtype(buf, DType::F32);
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), 256, 0, current_stream()>>>(
      s, ptr<float>(p), ptr<float>(g), buf.defined() ? ptr<float>(buf) : nullptr, n);
  HPM_CUDA_LAUNCH_CHECK("sgd_kernel");
}

}  // namespace hpm::cuda
