// Adam's fused step (clip_and_step: one adam_step_multi_ per group of parameters that share a
// device and a weight decay, the clipping norm read where it was computed) against the
// per-parameter path (clip_grad_norm, then update() one parameter at a time): the same bits in
// the parameters, their moments and the clipped gradients, with and without clipping, AMSGrad,
// decay only on matrices, and a parameter without a gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "hpm/optim/optimizer.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/random.h"

namespace hpm::optim {
namespace {

nn::NamedTensors make_params(std::uint64_t seed) {
  Generator g(seed);
  nn::NamedTensors out;
  const std::vector<Shape> shapes = {{8, 5}, {5}, {3, 8}, {3}, {4, 4}, {9000}};
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = Tensor::randn(shapes[i], g);
    p.set_requires_grad(true);
    std::string name = "p";
    name += std::to_string(i);  // not "p" + ...: GCC 12's -Wrestrict false positive
    out.emplace_back(name, p);
  }
  return out;
}

void set_grads(const nn::NamedTensors& params, int step, float scale) {
  Generator g(100 + static_cast<std::uint64_t>(step));
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i == 4) continue;  // no gradient: skipped by both paths
    Tensor p = params[i].second;
    p.set_grad(Tensor::randn(p.shape(), g, 0.0f, scale));
  }
}

std::vector<std::vector<float>> snapshot(const Optimizer& opt) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : opt.params()) {
    out.push_back(p.to_vector());
    if (p.grad().defined()) out.push_back(p.grad().to_vector());
  }
  for (const auto& [name, t] : opt.state())
    if (t.dtype() == DType::F32) out.push_back(t.to_vector());
  return out;
}

void expect_same_as_per_parameter(const AdamOptions& o, float max_norm, float grad_scale) {
  nn::NamedTensors fused_params = make_params(1), plain_params = make_params(1);
  AdamW fused(fused_params, o), plain(plain_params, o);
  std::vector<std::size_t> all;
  for (std::size_t i = 0; i < plain_params.size(); ++i) all.push_back(i);
  for (int step = 0; step < 4; ++step) {
    set_grads(fused_params, step, grad_scale);
    set_grads(plain_params, step, grad_scale);
    const auto multi_before = dispatch_count(DeviceType::kCpu, Op::kAdamStepMulti);
    fused.clip_and_step(max_norm);
    // Two groups: the decayed matrices and the undecayed vectors.
    EXPECT_EQ(dispatch_count(DeviceType::kCpu, Op::kAdamStepMulti) - multi_before, 2u);
    plain.begin_step();
    if (max_norm > 0) {
      std::vector<Tensor> ps;
      for (const auto& [name, p] : plain_params) ps.push_back(p);
      clip_grad_norm(ps, max_norm);
    }
    plain.step_params(all);
    ASSERT_EQ(snapshot(fused), snapshot(plain)) << "step " << step;
  }
  EXPECT_EQ(fused.steps(), plain.steps());
}

AdamOptions options(bool amsgrad) {
  AdamOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.1f;
  o.weight_decay_min_rank = 2;
  o.amsgrad = amsgrad;
  return o;
}

TEST(FusedAdam, ClippedEqualsClipGradNormThenPerParameterUpdates) {
  expect_same_as_per_parameter(options(false), 1.0f, 5.0f);  // norm ~ 500: clipped
}

TEST(FusedAdam, UnclippedAndWithoutClippingEqualThePerParameterPath) {
  expect_same_as_per_parameter(options(false), 1e6f, 1.0f);
  expect_same_as_per_parameter(options(false), 0.0f, 1.0f);
}

TEST(FusedAdam, AmsgradClippedEqualsThePerParameterPath) {
  expect_same_as_per_parameter(options(true), 1.0f, 5.0f);
}

TEST(FusedAdam, ANonFiniteNormClipsNothingAsClipGradNorm) {
  nn::NamedTensors fused_params = make_params(2), plain_params = make_params(2);
  AdamW fused(fused_params, options(false)), plain(plain_params, options(false));
  set_grads(fused_params, 0, 1.0f);
  set_grads(plain_params, 0, 1.0f);
  for (auto* params : {&fused_params, &plain_params}) {
    Tensor g = (*params)[0].second.grad();
    g.data<float>()[0] = std::numeric_limits<float>::infinity();
  }
  fused.clip_and_step(1.0f);
  plain.begin_step();
  std::vector<Tensor> ps;
  for (const auto& [name, p] : plain_params) ps.push_back(p);
  clip_grad_norm(ps, 1.0f);
  plain.step_params({0, 1, 2, 3, 4, 5});
  const auto a = snapshot(fused), b = snapshot(plain);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    for (std::size_t k = 0; k < a[i].size(); ++k) {
      if (std::isnan(a[i][k])) {
        EXPECT_TRUE(std::isnan(b[i][k]));
      } else {
        EXPECT_EQ(a[i][k], b[i][k]);
      }
    }
  }
}

}  // namespace
}  // namespace hpm::optim
