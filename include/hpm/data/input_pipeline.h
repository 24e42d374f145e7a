// A labelled image pipeline described by plain settings (what the config's [data] section holds).
// With a full shuffle (or none): batched_slices -> zip(random seeds) -> map(augment a batch,
// parallel) -> [prefetch]. With a bounded shuffle buffer or a cache: from_tensor_slices ->
// [cache] -> [shuffle] -> zip(random seeds) -> map(augment, parallel) -> batch -> [prefetch].
// Elements are (images (N,C,H,W) F32, labels (N) I64).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpm/data/dataset.h"
#include "hpm/data/in_memory.h"
#include "hpm/io/tfrecord.h"

namespace hpm::data {

struct AugmentOp {
  std::string op;  // random_crop | random_flip | normalize | resize
  int padding = 0;
  std::int64_t height = 0, width = 0;  // random_crop, resize
  std::vector<float> mean, std;        // normalize
};

// build_tfrecord_input_pipeline's buffer for shuffle_buffer = -1 (its files are shuffled too).
constexpr std::int64_t kTfRecordShuffleBuffer = 10000;

struct InputPipelineSpec {
  // 0: no shuffle; -1: the whole data set (TFRecord files: the files, and the records through a
  // buffer of kTfRecordShuffleBuffer); N: a buffer of N.
  std::int64_t shuffle_buffer = 0;
  std::uint64_t seed = 0;
  std::vector<AugmentOp> augment;
  int parallel_calls = kAutotune;
  bool deterministic = true;
  std::int64_t batch_size = 64;
  bool drop_remainder = true;
  std::int64_t prefetch = kAutotune;  // 0: none
  bool cache = false;                 // before shuffling: in memory, or in cache_path if set
  std::string cache_path;
  // This worker's share of the data (tf.data's auto-sharding): element i belongs to shard
  // i % num_shards; with shard_files, TFRecord files are dealt out instead of elements.
  std::int64_t num_shards = 1, shard_index = 0;
  bool shard_files = false;
  // build_tfrecord_input_pipeline: the first `limit` records (0: all), in file order (the files are
  // then not shuffled), the same every epoch; with shard_files, this worker's share of them.
  std::int64_t limit = 0;
};

// Throws std::invalid_argument naming a bad op or setting.
Dataset build_input_pipeline(const LabelledData& data, const InputPipelineSpec& spec);

// The same over TFRecord files of tf.train.Example {image: raw square grey bytes or PNG/JPEG,
// label: int64} (what `hpm data convert` writes): list_files -> interleave (parallel reads) ->
// map(decode) -> [cache] -> shuffle (a full shuffle becomes a 10k buffer) -> augment -> batch ->
// [prefetch].
Dataset build_tfrecord_input_pipeline(const std::string& files, io::Compression compression,
                                      const InputPipelineSpec& spec);
// The records of the matching files (std::invalid_argument when none matches; IoErrors name a
// corrupt or mis-compressed file and the byte).
std::int64_t count_tfrecords(const std::string& files, io::Compression compression);
// Every example of the matching files, in file order, as an in-memory set (for evaluation).
LabelledData load_tfrecord_examples(const std::string& files, io::Compression compression);
// (record bytes) -> (image (C,H,W) F32 in [0,1], label I64 scalar).
Element decode_image_example(Element record);

// The augmentation of one (image, label, seed) element, as the per-element pipeline applies it.
Element augment_element(Element e, const std::vector<AugmentOp>& ops);
// The same over a batch (images, labels, seed), row i seeded by augment_seed(seed, 0, i).
Element augment_batch(Element e, const std::vector<AugmentOp>& ops);
// What evaluation data takes of a training pipeline's augmentation: its deterministic ops
// (normalize, resize), in order, on each image of `images` (N, ...); the random ones are
// training's alone (torchvision's test transform). `images` itself when there are none.
Tensor evaluation_transform(const Tensor& images, const std::vector<AugmentOp>& ops);

}  // namespace hpm::data
