// Optimizer::begin_step + step_params from several threads (how pipeline stages update their own
// parameters) must equal one step(): same numbers, same step count for Adam's bias correction.
#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

#include "hpm/optim/optimizer.h"
#include "hpm/tensor/random.h"

namespace hpm::optim {
namespace {

nn::NamedTensors part_params(std::uint64_t seed) {
  Generator g(seed);
  nn::NamedTensors out;
  for (const char* name : {"w0", "w1", "w2", "w3"}) {
    Tensor p = Tensor::randn({3, 5}, g);
    p.set_requires_grad(true);
    out.emplace_back(name, p);
  }
  return out;
}

void set_grads(const nn::NamedTensors& params, int step) {
  Generator g(100 + static_cast<std::uint64_t>(step));
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i == 2) continue;  // a parameter without a gradient is skipped, in parts as in whole
    Tensor p = params[i].second;
    p.set_grad(Tensor::randn({3, 5}, g));
  }
}

TEST(StepInParts, EqualsOneStepForAdam) {
  nn::NamedTensors whole = part_params(1), parts = part_params(1);
  Adam a(whole, AdamOptions{}), b(parts, AdamOptions{});
  for (int step = 0; step < 3; ++step) {
    set_grads(whole, step);
    set_grads(parts, step);
    a.step();
    b.begin_step();
    std::thread t0([&] { b.step_params({0, 3}); });
    std::thread t1([&] { b.step_params({1, 2}); });
    t0.join();
    t1.join();
  }
  EXPECT_EQ(a.steps(), b.steps());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i].second.to_vector(), parts[i].second.to_vector()) << whole[i].first;
  }
}

TEST(StepInParts, RejectsAnIndexOutOfRange) {
  nn::NamedTensors params = part_params(2);
  SGD sgd(params, SgdOptions{0.1f});
  sgd.begin_step();
  EXPECT_THROW(sgd.step_params({4}), std::out_of_range);
}

}  // namespace
}  // namespace hpm::optim
