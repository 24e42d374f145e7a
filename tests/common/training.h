// Small training fixtures shared by the strategy, accumulation and pipeline tests: a random
// classification batch, the loss, and a model's parameters or gradients as one flat vector.
#pragma once
#include <cstdint>
#include <vector>

#include "hpm/autograd/ops.h"
#include "hpm/nn/module.h"
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
