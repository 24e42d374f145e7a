// What the config's [data] section describes, as `hpm train`, `hpm distill` and `hpm data bench`
// use it.
#pragma once
#include <cstdint>

#include "hpm/config/config.h"
#include "hpm/data/dataset.h"
#include "hpm/data/in_memory.h"
#include "hpm/data/token_shard.h"
#include "hpm/distribute/strategy.h"

namespace hpm::config {

// The training pipeline; `*examples` is the training set's size (-1 when reading TFRecord files).
// With a `strategy` spanning workers and [strategy] shard other than "batch", this worker's shard.
data::Dataset training_pipeline(const Config& cfg, std::int64_t* examples,
                                const distribute::Strategy* strategy = nullptr);
// Training by steps (max_steps): the epochs of `epochs` repeated and cut into the stretches
// between evaluations (Dataset::stretches); else `epochs` itself.
data::Dataset in_stretches(const Config& cfg, data::Dataset epochs);
// A language model's training tokens (source "text" or "tokens"), as training_pipeline reads them.
data::TokenSequence training_tokens(const Config& cfg);
// The evaluation set ([data] test_limit applied), through the deterministic ops of [data] augment
// (normalize, resize) as the training images are: data::evaluation_transform.
data::LabelledData test_set(const Config& cfg);

}  // namespace hpm::config
