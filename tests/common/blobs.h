// A small learnable classification set for trainer tests: two Gaussian blobs per class in 8
// dimensions, learnable but not in one step.
#pragma once
#include "hpm/data/in_memory.h"
#include "hpm/tensor/random.h"

namespace hpm::testing {

inline data::LabelledData blobs(std::int64_t n, std::uint64_t seed) {
  Generator gen(seed);
  data::LabelledData d;
  d.inputs = Tensor::randn({n, 8}, gen);
  d.labels = Tensor::zeros({n}, DType::I64);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t c = static_cast<std::int64_t>(gen.below(3));
    d.labels.data<std::int64_t>()[i] = c;
    d.inputs.data<float>()[i * 8 + c] += 2.5f;
  }
  return d;
}

}  // namespace hpm::testing
