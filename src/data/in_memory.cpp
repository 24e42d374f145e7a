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

IdxSplit read_idx_split(const std::string& dir, const std::string& split) {
  IdxSplit s;
  s.image_path = find_idx(dir, split + "-images-idx3-ubyte");
  s.label_path = find_idx(dir, split + "-labels-idx1-ubyte");
  s.images = io::read_idx(s.image_path);
  const io::IdxArray labels = io::read_idx(s.label_path);
  if (s.images.dims.size() != 3) {
    throw io::IoError(s.image_path + ": expected 3 dimensions (N, H, W), found " +
                      std::to_string(s.images.dims.size()));
  }
  if (labels.dims.size() != 1 || labels.dims[0] != s.images.dims[0]) {
    throw io::IoError(s.label_path + ": expected " + std::to_string(s.images.dims[0]) +
                      " labels to match " + s.image_path);
  }
  try {
    s.labels = io::idx_to_i64(labels);
  } catch (const io::IoError& e) {
    throw io::IoError(s.label_path + ": " + e.what());
  }
  return s;
}

LabelledData load_mnist_split(const std::string& dir, const std::string& split) {
  const IdxSplit s = read_idx_split(dir, split);
  LabelledData d;
  d.inputs = io::idx_to_f32(s.images, 1.0f / 255.0f)
                 .reshape({s.images.dims[0], 1, s.images.dims[1], s.images.dims[2]});
  d.labels = s.labels;
  return d;
}

}  // namespace hpm::data
