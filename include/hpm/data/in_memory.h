// A labelled data set held in memory, as read from IDX files (Fashion-MNIST, MNIST). Pipelines
// over it are built with data/pipeline.h.
#pragma once
#include <cstdint>
#include <string>

#include "hpm/tensor/tensor.h"

namespace hpm::data {

struct LabelledData {
  Tensor inputs;  // (N, ...) F32
  Tensor labels;  // (N) I64
  std::int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
  // The first `n` rows (views); all of them when n <= 0 or n >= size(): a data limit's cut.
  LabelledData first(std::int64_t n) const {
    if (n <= 0 || n >= size()) return *this;
    return {inputs.narrow(0, n), labels.narrow(0, n)};
  }
};

// Reads `<dir>/<split>-images-idx3-ubyte[.gz]` and `<dir>/<split>-labels-idx1-ubyte[.gz]`
// (split "train" or "t10k"), images scaled to [0, 1] as (N, 1, H, W). Throws io::IoError naming
// the file for anything missing, corrupt or inconsistent.
LabelledData load_mnist_split(const std::string& dir, const std::string& split);

}  // namespace hpm::data
