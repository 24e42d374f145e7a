// Small training fixtures shared by the strategy, accumulation and pipeline tests: a random
// classification batch, the loss, and a model's parameters or gradients as one flat vector.
#pragma once
#include <cstdint>
#include <memory>
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

inline std::vector<float> flat_grads(const nn::Module& m) {
  std::vector<float> out;
  for (const auto& p : m.parameters()) {
    auto v = p.grad().to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace hpm::testing
