// Small training fixtures shared by the strategy, accumulation and pipeline tests: a random
// classification batch, the loss, and a model's parameters or gradients as one flat vector.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hpm/autograd/ops.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/module.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/random.h"

namespace hpm::testing {

struct Batch {
  Tensor x, y;
};

// n rows of `features` standard-normal inputs and labels uniform in [0, classes).
inline Batch random_batch(std::int64_t n, std::uint64_t seed, std::int64_t features = 12,
                          std::int64_t classes = 4) {
  Generator gen(seed);
  Batch b{Tensor::randn({n, features}, gen), Tensor::zeros({n}, DType::I64)};
  for (std::int64_t i = 0; i < n; ++i)
    b.y.data<std::int64_t>()[i] =
        static_cast<std::int64_t>(gen.below(static_cast<std::uint64_t>(classes)));
  return b;
}

// 12 -> 16 -> 16 -> 4 with ReLUs, initialized from the default generator.
inline std::shared_ptr<nn::Module> small_model() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(12, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4)});
}

// SGD, lr 0.1, momentum 0.9.
inline std::shared_ptr<optim::Optimizer> sgd(nn::Module& m) {
  optim::SgdOptions o;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  return std::make_shared<optim::SGD>(m.named_parameters(), o);
}

inline Tensor cross_entropy_loss(const Tensor& logits, const Tensor& labels) {
  return cross_entropy(logits, labels);
}

inline std::vector<float> flat_parameters(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    auto v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// An optimizer's F32 state (moments, momentum buffers) as one flat vector, in state()'s order.
inline std::vector<float> flat_optimizer_state(const optim::Optimizer& opt) {
  std::vector<float> out;
  for (const auto& [name, t] : opt.state()) {
    if (t.dtype() != DType::F32) continue;
    const std::vector<float> v = t.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

inline std::vector<float> flat_grads(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    auto v = p.grad().to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The parameters of two training runs agree to `tolerance` relative (with 1e-3 absolute slack
// for values near zero): the strategy, pipeline and model tests' yardstick for "equals one
// device up to float reassociation".
inline void expect_same_parameters(const std::vector<float>& a, const std::vector<float>& b,
                                   const std::string& what, float tolerance = 1e-4f) {
  ASSERT_EQ(a.size(), b.size()) << what;
  float worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (1e-3f + std::abs(a[i])));
  EXPECT_LT(worst, tolerance) << what;
}

// Runs fn(w) for w in [0, n) on n threads at once, as n worker processes would (each with a
// default generator seeded `seed`, as a process that called manual_seed(seed)), and joins them.
inline void on_workers(int n, std::uint64_t seed, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int w = 0; w < n; ++w) {
    threads.emplace_back([&fn, w, seed] {
      Generator init(seed);
      ThreadGeneratorGuard guard(init);
      fn(w);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace hpm::testing
