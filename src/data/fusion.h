// Internal to the data layer: graph rewrites applied when a pipeline is built (as tf.data's
// static optimizations).
#pragma once
#include <optional>

#include "hpm/data/dataset.h"

namespace hpm::data {

// A parallel map directly followed by batch (no padding) becomes one map_and_batch stage.
std::optional<Dataset> fuse_map_and_batch(const DatasetNode& node, std::int64_t batch, bool drop);

}  // namespace hpm::data
