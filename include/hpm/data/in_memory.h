// The minimal data path that training needs before the full input pipeline exists: a labelled
// data set held in memory (Fashion-MNIST from its IDX files) and a shuffled batcher whose order
// is a pure function of (seed, epoch), so a resumed run sees exactly the batches it would have.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpm/tensor/tensor.h"

namespace hpm::data {

struct LabelledData {
  Tensor inputs;  // (N, ...) F32
  Tensor labels;  // (N) I64
  std::int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

// Reads `<dir>/<split>-images-idx3-ubyte[.gz]` and `<dir>/<split>-labels-idx1-ubyte[.gz]`
// (split "train" or "t10k"), images scaled to [0, 1] as (N, 1, H, W). Throws io::IoError naming
// the file for anything missing, corrupt or inconsistent.
LabelledData load_mnist_split(const std::string& dir, const std::string& split);

class Batcher {
 public:
  Batcher(const LabelledData& data, std::int64_t batch_size, bool shuffle, std::uint64_t seed,
          bool drop_last);

  void start_epoch(std::int64_t epoch);  // resets the position to the first batch
  // The next batch of the epoch; false at its end.
  bool next(Tensor& inputs, Tensor& labels);
  std::int64_t batches_per_epoch() const;
  std::int64_t position() const { return position_; }  // batches served this epoch
  void seek(std::int64_t epoch, std::int64_t position);  // for resume

 private:
  const LabelledData* data_;
  std::int64_t batch_size_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t position_ = 0;
  std::vector<std::int64_t> order_;
};

}  // namespace hpm::data
