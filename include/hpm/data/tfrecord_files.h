// TFRecord files of tf.train.Example, made and read whole: an IDX data set (Fashion-MNIST) written
// as sharded record files, and what the records of a file hold.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "hpm/io/example.h"
#include "hpm/io/tfrecord.h"

namespace hpm::data {

struct WrittenShard {
  std::string path;
  std::int64_t records = 0;
};

// Both splits ("train", "t10k") of the IDX set in `idx_dir` as `shards` files each,
// `out_dir`/SPLIT-0000S-of-0000N.tfrecord[.gz|.zlib], example i in shard i mod N: Examples of
// {image: the image's bytes (raw pixels, or a PNG when `png`), label: int64}. Throws io::IoError
// naming the file for anything unreadable or unwritable.
std::vector<WrittenShard> write_idx_as_tfrecords(const std::string& idx_dir,
                                                 const std::string& out_dir, int shards,
                                                 io::Compression compression, bool png);

// What one feature looks like across a file's records.
struct FeatureSummary {
  io::Feature::Kind kind;
  std::size_t min_values = 0, max_values = 0;  // values per record
  std::size_t min_bytes = 0, max_bytes = 0;    // per bytes value (0, 0 when it holds none)
};
struct TfRecordSummary {
  std::int64_t records = 0;
  std::map<std::string, FeatureSummary> features;
};

// Reads every record of `file` as an Example (a record that is not one is an error naming the file
// and the record's index).
TfRecordSummary summarize_tfrecord_examples(const std::string& file, io::Compression compression);

}  // namespace hpm::data
