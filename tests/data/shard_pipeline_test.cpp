// build_input_pipeline's worker shards (tf.data auto-sharding by elements): the shards are disjoint,
// cover the data, and each batches at the batch size it is given.
#include <gtest/gtest.h>

#include <set>

#include "hpm/data/input_pipeline.h"

namespace hpm::data {
namespace {

TEST(PipelineShards, DisjointAndCoveringByElements) {
  const std::int64_t n = 103;
  LabelledData d{Tensor::empty({n, 2}), Tensor::empty({n}, DType::I64)};
  for (std::int64_t i = 0; i < n; ++i) {
    d.inputs.data<float>()[2 * i] = static_cast<float>(i);
    d.inputs.data<float>()[2 * i + 1] = static_cast<float>(-i);
    d.labels.data<std::int64_t>()[i] = i;
  }
  std::set<std::int64_t> seen;
  for (std::int64_t shard = 0; shard < 3; ++shard) {
    InputPipelineSpec spec;
    spec.batch_size = 5;
    spec.drop_remainder = false;
    spec.prefetch = 0;
    spec.shuffle_buffer = -1;
    spec.num_shards = 3;
    spec.shard_index = shard;
    auto it = build_input_pipeline(d, spec).make_iterator();
    Element e;
    while (it->next(e)) {
      EXPECT_LE(e[1].numel(), 5);
      for (std::int64_t r = 0; r < e[1].numel(); ++r) {
        const std::int64_t label = e[1].data<std::int64_t>()[r];
        EXPECT_EQ(label % 3, shard);
        EXPECT_EQ(e[0].data<float>()[2 * r + 1], static_cast<float>(-label));  // rows stay whole
        EXPECT_TRUE(seen.insert(label).second) << "element " << label << " in two shards";
      }
    }
  }
  EXPECT_EQ(static_cast<std::int64_t>(seen.size()), n);
}

TEST(PipelineShards, BadShardsAreRejected) {
  LabelledData d{Tensor::zeros({4, 2}), Tensor::zeros({4}, DType::I64)};
  InputPipelineSpec spec;
  spec.num_shards = 2;
  spec.shard_index = 2;
  EXPECT_THROW(build_input_pipeline(d, spec), std::invalid_argument);
  spec.shard_index = 0;
  spec.shard_files = true;
  EXPECT_THROW(build_input_pipeline(d, spec), std::invalid_argument);
}

}  // namespace
}  // namespace hpm::data
