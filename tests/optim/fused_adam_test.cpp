// Adam's fused step (clip_and_step: one adam_step_multi_ per group of parameters that share a
// device and a weight decay, the clipping norm read where it was computed) against the
// per-parameter path (clip_grad_norm, then update() one parameter at a time): the same bits in
// the parameters, their moments and the clipped gradients, with and without clipping, AMSGrad,
// decay only on matrices, and a parameter without a gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

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

// A norm that is not finite skips the update on either path (Adam's fused one, gated on the
// device; SGD's per-parameter one, on the host): nothing changes, not even the gradients, every
// later step skips too (the parameters stay as they were before the bad step), and
// resume_updates() lets the next one through.
TEST(FusedAdam, ANonFiniteNormSkipsThisAndLaterUpdatesUntilResumed) {
  for (const bool adam : {true, false}) {
    SCOPED_TRACE(adam ? "AdamW, fused" : "SGD, per parameter");
    nn::NamedTensors params = make_params(2);
    std::unique_ptr<Optimizer> opt;
    if (adam) {
      opt = std::make_unique<AdamW>(params, options(false));
    } else {
      opt = std::make_unique<SGD>(params, SgdOptions{0.1f, 0.9f});
    }
    set_grads(params, 0, 1.0f);
    opt->clip_and_step(1.0f);  // a good step first: every buffer exists
    EXPECT_FALSE(opt->updates_halted());
    set_grads(params, 1, 1.0f);
    params[0].second.grad().data<float>()[0] = std::numeric_limits<float>::infinity();
    const auto before = snapshot(*opt);
    opt->clip_and_step(1.0f);
    EXPECT_TRUE(opt->updates_halted());
    EXPECT_EQ(snapshot(*opt), before) << "the step with an infinite gradient changed something";
    set_grads(params, 2, 1.0f);  // finite again: still skipped
    const auto halted = snapshot(*opt);
    opt->clip_and_step(1.0f);
    EXPECT_EQ(snapshot(*opt), halted) << "a step after the halt changed something";
    opt->resume_updates();
    EXPECT_FALSE(opt->updates_halted());
    const std::vector<float> p0 = params[0].second.to_vector();
    opt->clip_and_step(1.0f);
    EXPECT_FALSE(opt->updates_halted());
    EXPECT_NE(params[0].second.to_vector(), p0) << "resume_updates() did not resume";
  }
}

// State saved by another optimizer is refused by load_state, naming the entry (it loaded as
// unused buffers, the new optimizer's moments starting from zero at a late step count); the same
// optimizer's state round-trips.
TEST(OptimizerState, AnotherOptimizersStateIsRefused) {
  nn::NamedTensors params = make_params(3);
  SGD sgd(params, SgdOptions{0.1f, 0.9f});
  AdamW adam(params, options(false));
  set_grads(params, 0, 1.0f);
  sgd.step();
  adam.step();
  try {
    adam.load_state(sgd.state());
    FAIL() << "Adam took SGD's state";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("p0.momentum_buffer' is not AdamW's"), std::string::npos)
        << e.what();
  }
  try {
    sgd.load_state(adam.state());
    FAIL() << "SGD took Adam's state";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is not SGD's"), std::string::npos) << e.what();
  }
  AdamW again(params, options(false));
  again.load_state(adam.state());
  EXPECT_EQ(snapshot(again), snapshot(adam));
}

}  // namespace
}  // namespace hpm::optim
