// A labelled data set held in memory, as read from IDX files (Fashion-MNIST, MNIST). Pipelines
// over it are built with data/pipeline.h.
#pragma once
#include <cstdint>
#include <string>

#include "hpm/io/idx.h"
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

// The IDX pair of `split` in `dir` as stored, checked to agree: images (N, H, W) of any IDX type,
// N labels of an integer type (as int64). Throws io::IoError naming the file. What
// load_mnist_split and `hpm data convert` read.
struct IdxSplit {
  std::string image_path, label_path;
  io::IdxArray images;
  Tensor labels;  // (N) I64
};
IdxSplit read_idx_split(const std::string& dir, const std::string& split);

// Reads `<dir>/<split>-images-idx3-ubyte[.gz]` and `<dir>/<split>-labels-idx1-ubyte[.gz]`
// (split "train" or "t10k"), images scaled to [0, 1] as (N, 1, H, W). Throws io::IoError naming
// the file for anything missing, corrupt or inconsistent.
LabelledData load_mnist_split(const std::string& dir, const std::string& split);

}  // namespace hpm::data
