#include "hpm/data/in_memory.h"

#include <filesystem>
#include <numeric>
#include <stdexcept>

#include "hpm/io/atomic_file.h"
#include "hpm/io/idx.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::data {

namespace {
std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    const std::string path = dir + "/" + stem + ext;
    if (std::filesystem::exists(path)) return path;
  }
  throw io::IoError("missing data file: neither " + dir + "/" + stem + ".gz nor " + dir + "/" +
                    stem + " exists (is the data set installed? Debian: apt-get install "
                    "dataset-fashion-mnist)");
}
}  // namespace

LabelledData load_mnist_split(const std::string& dir, const std::string& split) {
  const std::string image_path = find_idx(dir, split + "-images-idx3-ubyte");
  const std::string label_path = find_idx(dir, split + "-labels-idx1-ubyte");
  io::IdxArray images = io::read_idx(image_path);
  io::IdxArray labels = io::read_idx(label_path);
  if (images.dims.size() != 3) {
    throw io::IoError(image_path + ": expected 3 dimensions (N, H, W), found " +
                      std::to_string(images.dims.size()));
  }
  if (labels.dims.size() != 1 || labels.dims[0] != images.dims[0]) {
    throw io::IoError(label_path + ": expected " + std::to_string(images.dims[0]) +
                      " labels to match " + image_path);
  }
  LabelledData d;
  d.inputs = io::idx_to_f32(images, 1.0f / 255.0f)
                 .reshape({images.dims[0], 1, images.dims[1], images.dims[2]});
  d.labels = io::idx_to_i64(labels);
  return d;
}

Batcher::Batcher(const LabelledData& data, std::int64_t batch_size, bool shuffle,
                 std::uint64_t seed, bool drop_last)
    : data_(&data), batch_size_(batch_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (batch_size <= 0) throw std::invalid_argument("batch size must be positive");
  start_epoch(0);
}

void Batcher::start_epoch(std::int64_t epoch) {
  order_.resize(static_cast<std::size_t>(data_->size()));
  std::iota(order_.begin(), order_.end(), std::int64_t{0});
  if (shuffle_) {
    // Fisher-Yates from a generator seeded by (seed, epoch): reproducible on resume.
    Generator gen(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch) + 1);
    for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[gen.below(i)]);
  }
  position_ = 0;
}

std::int64_t Batcher::batches_per_epoch() const {
  const std::int64_t n = data_->size();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

bool Batcher::next(Tensor& inputs, Tensor& labels) {
  if (position_ >= batches_per_epoch()) return false;
  const std::int64_t begin = position_ * batch_size_;
  const std::int64_t end = std::min<std::int64_t>(begin + batch_size_, data_->size());
  const std::vector<std::int64_t> idx(order_.begin() + begin, order_.begin() + end);
  inputs = kernels::index_select0(data_->inputs, idx);
  labels = kernels::index_select0(data_->labels, idx);
  ++position_;
  return true;
}

void Batcher::seek(std::int64_t epoch, std::int64_t position) {
  start_epoch(epoch);
  if (position < 0 || position > batches_per_epoch()) {
    throw std::out_of_range("Batcher::seek: position " + std::to_string(position) + " of " +
                            std::to_string(batches_per_epoch()) + " batches");
  }
  position_ = position;
}

}  // namespace hpm::data
