#include "hpm/data/input_pipeline.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <stdexcept>

#include "hpm/data/file_sources.h"
#include "hpm/data/image.h"
#include "hpm/data/image_codec.h"
#include "hpm/io/crc32c.h"
#include "hpm/io/tfrecord.h"

namespace hpm::data {

namespace {
bool deterministic(const AugmentOp& op) { return op.op == "normalize" || op.op == "resize"; }

Tensor augment_image(Tensor image, const std::vector<AugmentOp>& ops, Generator& gen) {
  for (const AugmentOp& op : ops) {
    if (op.op == "random_crop") {
      image = random_crop(image, op.padding, op.height, op.width, gen);
    } else if (op.op == "random_flip") {
      image = random_flip_left_right(image, gen);
    } else if (op.op == "normalize") {
      image = normalize(image, op.mean, op.std);
    } else if (op.op == "resize") {
      image = resize_bilinear(image, op.height, op.width);
    }
  }
  return image;
}
}  // namespace

Tensor evaluation_transform(const Tensor& images, const std::vector<AugmentOp>& ops) {
  std::vector<AugmentOp> fixed;
  std::copy_if(ops.begin(), ops.end(), std::back_inserter(fixed), deterministic);
  if (fixed.empty() || images.size(0) == 0) return images;
  Generator unused(0);
  std::vector<std::int64_t> row_dims(images.shape().dims().begin() + 1,
                                     images.shape().dims().end());
  Tensor out;
  for (std::int64_t i = 0; i < images.size(0); ++i) {
    const Tensor row = augment_image(images.narrow(i, 1).reshape(Shape(row_dims)), fixed, unused);
    if (!out.defined()) {
      std::vector<std::int64_t> dims{images.size(0)};
      dims.insert(dims.end(), row.shape().dims().begin(), row.shape().dims().end());
      out = Tensor::empty(Shape(dims));
    }
    out.narrow(i, 1).copy_(row);
  }
  return out;
}

Element augment_element(Element e, const std::vector<AugmentOp>& ops) {
  // e = (image, label, seed)
  Generator gen(static_cast<std::uint64_t>(e[2].data<std::int64_t>()[0]));
  return {augment_image(e[0], ops, gen), e[1]};
}

Element augment_batch(Element e, const std::vector<AugmentOp>& ops) {
  // e = (images (N, ...), labels (N), seed): row i draws from augment_seed(seed, 0, i).
  const auto seed = static_cast<std::uint64_t>(e[2].data<std::int64_t>()[0]);
  const Tensor& images = e[0];
  const std::int64_t n = images.size(0);
  std::vector<std::int64_t> row_dims(images.shape().dims().begin() + 1,
                                     images.shape().dims().end());
  Tensor out;
  for (std::int64_t i = 0; i < n; ++i) {
    Generator gen(augment_seed(seed, 0, i));
    const Tensor row = augment_image(images.narrow(i, 1).reshape(Shape(row_dims)), ops, gen);
    if (!out.defined()) {
      std::vector<std::int64_t> dims{n};
      dims.insert(dims.end(), row.shape().dims().begin(), row.shape().dims().end());
      out = Tensor::empty(Shape(dims));
    }
    out.narrow(i, 1).copy_(row);
  }
  return {out, e[1]};
}

namespace {
void check_augment(const std::vector<AugmentOp>& augment) {
  for (const AugmentOp& op : augment) {
    if (op.op != "random_crop" && op.op != "random_flip" && op.op != "normalize" &&
        op.op != "resize") {
      throw std::invalid_argument("unknown augmentation op '" + op.op +
                                  "' (known: random_crop, random_flip, normalize, resize)");
    }
    if ((op.op == "random_crop" || op.op == "resize") && (op.height <= 0 || op.width <= 0)) {
      throw std::invalid_argument(op.op + " needs a positive size");
    }
    if (op.op == "normalize" && (op.mean.empty() || op.std.empty())) {
      throw std::invalid_argument("normalize needs mean and std");
    }
  }
}
}  // namespace

Element decode_image_example(Element record) {
  const io::Example ex = io::decode_example(tensor_bytes(record.at(0)), "example");
  const auto image = ex.find("image");
  const auto label = ex.find("label");
  if (image == ex.end() || image->second.kind != io::Feature::Bytes ||
      image->second.bytes.size() != 1 || label == ex.end() ||
      label->second.kind != io::Feature::Int64 || label->second.ints.size() != 1) {
    throw DataError("decode_image_example",
                    "expected features image (one bytes value) and label (one int64)");
  }
  const std::string& bytes = image->second.bytes[0];
  Tensor pixels;
  const bool encoded = bytes.size() >= 4 && (bytes.compare(0, 4, "\x89PNG") == 0 ||
                                             (static_cast<unsigned char>(bytes[0]) == 0xff &&
                                              static_cast<unsigned char>(bytes[1]) == 0xd8));
  if (encoded) {
    pixels = decode_image(bytes);
  } else {
    const auto side =
        static_cast<std::int64_t>(std::lround(std::sqrt(static_cast<double>(bytes.size()))));
    if (side * side != static_cast<std::int64_t>(bytes.size())) {
      throw DataError("decode_image_example", "raw image of " + std::to_string(bytes.size()) +
                                                  " bytes is not a square grey image");
    }
    pixels = Tensor::empty({1, side, side});
    float* d = pixels.data<float>();
    for (std::size_t i = 0; i < bytes.size(); ++i)
      d[i] = static_cast<unsigned char>(bytes[i]) / 255.0f;
  }
  return {pixels, Tensor::from_i64(std::vector<std::int64_t>{label->second.ints[0]}, Shape{})};
}

namespace {
void check_shards(const InputPipelineSpec& spec) {
  if (spec.num_shards < 1 || spec.shard_index < 0 || spec.shard_index >= spec.num_shards) {
    throw std::invalid_argument("shard " + std::to_string(spec.shard_index) + " of " +
                                std::to_string(spec.num_shards) + " does not exist");
  }
}

// Rows i with i % num_shards == index, copied.
LabelledData shard_rows(const LabelledData& data, std::int64_t num_shards, std::int64_t index) {
  const std::int64_t n = data.size(), rows = (n - index + num_shards - 1) / num_shards;
  Shape in_shape = data.inputs.shape();
  in_shape[0] = rows;
  LabelledData out{Tensor::empty(in_shape), Tensor::empty({rows}, DType::I64)};
  const std::int64_t width = data.inputs.numel() / std::max<std::int64_t>(n, 1);
  const float* src = data.inputs.data<float>();
  float* dst = out.inputs.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t i = r * num_shards + index;
    std::copy(src + i * width, src + (i + 1) * width, dst + r * width);
    out.labels.data<std::int64_t>()[r] = data.labels.data<std::int64_t>()[i];
  }
  return out;
}
}  // namespace

Dataset build_tfrecord_input_pipeline(const std::string& files, io::Compression compression,
                                      const InputPipelineSpec& spec) {
  check_augment(spec.augment);
  check_shards(spec);
  if (spec.limit < 0) throw std::invalid_argument("the record limit must be >= 0");
  // A limit takes the first records in file order: the same ones every epoch.
  Dataset listed = list_files(files, spec.shuffle_buffer != 0 && spec.limit == 0, spec.seed);
  const bool file_shards = spec.num_shards > 1 && spec.shard_files;
  if (file_shards) listed = listed.shard(spec.num_shards, spec.shard_index);
  Dataset d =
      listed
          .interleave(
              [compression](const Element& path) { return tfrecord_from_path(path, compression); },
              4, 1, kAutotune)
          .map(decode_image_example, MapOptions{spec.parallel_calls, spec.deterministic});
  if (spec.limit > 0) {
    d = d.take(file_shards ? spec.limit / spec.num_shards +
                                 (spec.shard_index < spec.limit % spec.num_shards ? 1 : 0)
                           : spec.limit);
  }
  if (spec.num_shards > 1 && !spec.shard_files) d = d.shard(spec.num_shards, spec.shard_index);
  if (spec.cache) {
    // The cache file is keyed by what produced its elements: the files (sizes, times), how they
    // were read, the limit and this worker's share.
    std::string key =
        "source=tfrecord\ncompression=" + std::string(io::compression_name(compression)) + "\n";
    for (const std::string& f : glob_paths(files)) {
      std::error_code ec;
      const auto size = std::filesystem::file_size(f, ec);
      const auto time = std::filesystem::last_write_time(f, ec).time_since_epoch().count();
      key += "file " + f + "=" + std::to_string(size) + " bytes, modified " + std::to_string(time) +
             "\n";
    }
    key += "limit=" + std::to_string(spec.limit) + "\nshard=" + std::to_string(spec.shard_index) +
           " of " + std::to_string(spec.num_shards) + (spec.shard_files ? " (files)" : "") + "\n";
    d = spec.cache_path.empty() ? d.cache() : d.cache(spec.cache_path, key);
  }
  // -1: the files are shuffled (list_files above) and the records through a buffer of
  // kTfRecordShuffleBuffer, as tf.data pipelines over files do. The whole decoded set in a
  // buffer would sit in memory, and in every mid-epoch backup's iterator state.
  if (spec.shuffle_buffer != 0) {
    d = d.shuffle(spec.shuffle_buffer < 0 ? kTfRecordShuffleBuffer : spec.shuffle_buffer,
                  spec.seed);
  }
  if (!spec.augment.empty()) {
    const std::vector<AugmentOp> ops = spec.augment;
    d = Dataset::zip({d, Dataset::random(spec.seed)})
            .map([ops](Element e) { return augment_element(std::move(e), ops); },
                 MapOptions{spec.parallel_calls, spec.deterministic});
  }
  d = d.batch(spec.batch_size, spec.drop_remainder);
  return spec.prefetch != 0 ? d.prefetch(spec.prefetch) : d;
}

std::int64_t count_tfrecords(const std::string& files, io::Compression compression) {
  const std::vector<std::string> paths = glob_paths(files);
  if (paths.empty()) throw std::invalid_argument("no file matches '" + files + "'");
  std::int64_t n = 0;
  std::string record;
  for (const std::string& p : paths) {
    io::TfRecordReader reader(p, compression);
    while (reader.next(record)) ++n;
  }
  return n;
}

LabelledData load_tfrecord_examples(const std::string& files, io::Compression compression) {
  InputPipelineSpec spec;
  spec.shuffle_buffer = 0;
  spec.batch_size = 1 << 30;  // one batch holding everything
  spec.drop_remainder = false;
  spec.prefetch = 0;
  spec.parallel_calls = 1;
  auto it = build_tfrecord_input_pipeline(files, compression, spec).make_iterator();
  Element all;
  LabelledData d;
  if (it->next(all)) {
    d.inputs = all[0];
    d.labels = all[1];
  }
  return d;
}

namespace {

// What a cache of in-memory rows is keyed by: their count, shapes and checksum.
std::string key_of(const LabelledData& d) {
  std::string key = "source=rows\nrows=" + std::to_string(d.size()) + "\n";
  for (const auto& [name, t] : {std::pair{"inputs", d.inputs}, std::pair{"labels", d.labels}}) {
    key += std::string(name) + " shape=" + t.shape().str() + "\n" + name +
           " crc32c=" + std::to_string(io::crc32c(t.raw_data(), t.nbytes())) + "\n";
  }
  return key;
}

}  // namespace

Dataset build_input_pipeline(const LabelledData& all, const InputPipelineSpec& spec) {
  check_augment(spec.augment);
  check_shards(spec);
  if (spec.shard_files)
    throw std::invalid_argument("sharding by files needs a file source (source = \"tfrecord\")");
  const LabelledData data =
      spec.num_shards > 1 ? shard_rows(all, spec.num_shards, spec.shard_index) : all;
  if (!spec.cache && (spec.shuffle_buffer == -1 || spec.shuffle_buffer == 0)) {
    // A full shuffle: gather whole batches, then augment batch by batch, so the sequential part of
    // the pipeline is one gather per batch and threads meet once per batch.
    Dataset b = Dataset::batched_slices({data.inputs, data.labels}, spec.batch_size,
                                        spec.shuffle_buffer != 0, spec.seed, spec.drop_remainder);
    if (!spec.augment.empty()) {
      const std::vector<AugmentOp> ops = spec.augment;
      b = Dataset::zip({b, Dataset::random(spec.seed)})
              .map([ops](Element e) { return augment_batch(std::move(e), ops); },
                   MapOptions{spec.parallel_calls, spec.deterministic});
    }
    return spec.prefetch != 0 ? b.prefetch(spec.prefetch) : b;
  }
  Dataset d = Dataset::from_tensor_slices({data.inputs, data.labels});
  if (spec.cache) d = spec.cache_path.empty() ? d.cache() : d.cache(spec.cache_path, key_of(data));
  if (spec.shuffle_buffer != 0) {
    d = d.shuffle(
        spec.shuffle_buffer < 0 ? std::max<std::int64_t>(1, data.size()) : spec.shuffle_buffer,
        spec.seed);
  }
  if (!spec.augment.empty()) {
    const std::vector<AugmentOp> ops = spec.augment;
    d = Dataset::zip({d, Dataset::random(spec.seed)})
            .map([ops](Element e) { return augment_element(std::move(e), ops); },
                 MapOptions{spec.parallel_calls, spec.deterministic});
  }
  d = d.batch(spec.batch_size, spec.drop_remainder);
  if (spec.prefetch != 0) d = d.prefetch(spec.prefetch);
  return d;
}

}  // namespace hpm::data
