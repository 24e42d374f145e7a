#include "hpm/data/in_memory.h"

#include <filesystem>
#include <stdexcept>

#include "hpm/io/atomic_file.h"
#include "hpm/io/idx.h"

namespace hpm::data {

namespace {
std::string find_idx(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    const std::string path = dir + "/" + stem + ext;
    if (std::filesystem::exists(path)) return path;
  }
  throw io::IoError("missing data file: neither " + dir + "/" + stem + ".gz nor " + dir + "/" +
                    stem +
                    " exists (is the data set installed? Debian: apt-get install "
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

}  // namespace hpm::data
