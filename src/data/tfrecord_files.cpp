#include "hpm/data/tfrecord_files.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "hpm/data/image_codec.h"
#include "hpm/data/in_memory.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/error.h"
#include "hpm/io/idx.h"

namespace hpm::data {

std::vector<WrittenShard> write_idx_as_tfrecords(const std::string& idx_dir,
                                                 const std::string& out_dir, int shards,
                                                 io::Compression compression, bool png) {
  io::ensure_directory(out_dir);
  const std::string ext = compression == io::Compression::Gzip   ? ".tfrecord.gz"
                          : compression == io::Compression::Zlib ? ".tfrecord.zlib"
                                                                 : ".tfrecord";
  // Shards of another conversion (another count or compression) beside these would be read with
  // them by a `files` glob, every example twice: refused before anything is written.
  const std::regex shard_name(R"((train|t10k)-\d{5}-of-(\d{5})(\.tfrecord(\.gz|\.zlib)?)?)");
  char count[8];
  std::snprintf(count, sizeof count, "%05d", shards);
  std::vector<std::string> others;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string n = e.path().filename().string();
    std::smatch m;
    if (std::regex_match(n, m, shard_name) && (m[2] != count || m[3] != ext)) others.push_back(n);
  }
  if (!others.empty()) {
    std::sort(others.begin(), others.end());
    throw io::IoError(
        out_dir + " holds shards of another conversion (" + others.front() +
        (others.size() > 1 ? " and " + std::to_string(others.size() - 1) + " more" : "") +
        ") that a files glob would read with these: remove them, or convert into "
        "another directory");
  }
  // Both splits read and checked as training reads them before anything is written (the labels'
  // count and integer type: a label was each one's first byte, and past the images' count bytes
  // beyond the file's).
  const IdxSplit pairs[] = {read_idx_split(idx_dir, "train"), read_idx_split(idx_dir, "t10k")};
  for (const IdxSplit& pair : pairs) {
    if (pair.images.type != io::kIdxU8) {
      throw io::IoError(pair.image_path +
                        ": the images must be unsigned bytes (IDX type 0x08) to be stored as "
                        "pixels");
    }
    if (!png && pair.images.dims[1] != pair.images.dims[2]) {
      throw io::IoError(pair.image_path + ": images of " + std::to_string(pair.images.dims[1]) +
                        "x" + std::to_string(pair.images.dims[2]) +
                        " pixels are not square, which raw records must be (their side is the "
                        "square root of their size): convert with --png");
    }
  }
  std::vector<WrittenShard> written;
  for (const IdxSplit& pair : pairs) {
    const char* split = &pair == &pairs[0] ? "train" : "t10k";
    const io::IdxArray& images = pair.images;
    const std::int64_t* labels = pair.labels.data<std::int64_t>();
    const std::int64_t n = images.dims[0];
    const auto image_bytes = static_cast<std::size_t>(images.dims[1] * images.dims[2]);
    for (int shard = 0; shard < shards; ++shard) {
      char name[96];
      std::snprintf(name, sizeof name, "/%s-%05d-of-%05d", split, shard, shards);
      WrittenShard out{out_dir + name + ext, 0};
      io::TfRecordWriter w(out.path, compression);
      for (std::int64_t i = shard; i < n; i += shards) {
        const auto* img = images.data.data() + static_cast<std::size_t>(i) * image_bytes;
        std::string bytes(reinterpret_cast<const char*>(img), image_bytes);
        if (png) {
          bytes = encode_png(
              io::idx_to_f32(io::IdxArray{io::kIdxU8,
                                          {1, images.dims[1], images.dims[2]},
                                          std::vector<unsigned char>(img, img + image_bytes)},
                             1.0f / 255.0f));
        }
        io::Example ex;
        ex["image"] = io::Feature::of_bytes({std::move(bytes)});
        ex["label"] = io::Feature::of_ints({labels[i]});
        w.write(io::encode_example(ex));
        ++out.records;
      }
      w.close();
      written.push_back(std::move(out));
    }
  }
  return written;
}

TfRecordSummary summarize_tfrecord_examples(const std::string& file, io::Compression compression) {
  io::TfRecordReader reader(file, compression);
  TfRecordSummary s;
  std::string record;
  while (reader.next(record)) {
    const io::Example ex =
        io::decode_example(record, file + " record " + std::to_string(s.records));
    for (const auto& [key, f] : ex) {
      const std::size_t values = f.kind == io::Feature::Bytes   ? f.bytes.size()
                                 : f.kind == io::Feature::Float ? f.floats.size()
                                                                : f.ints.size();
      auto [it, fresh] =
          s.features.try_emplace(key, FeatureSummary{f.kind, SIZE_MAX, 0, SIZE_MAX, 0});
      FeatureSummary& fs = it->second;
      fs.min_values = std::min(fs.min_values, values);
      fs.max_values = std::max(fs.max_values, values);
      for (const auto& b : f.bytes) {
        fs.min_bytes = std::min(fs.min_bytes, b.size());
        fs.max_bytes = std::max(fs.max_bytes, b.size());
      }
    }
    ++s.records;
  }
  for (auto& [key, fs] : s.features) {
    if (fs.min_values == SIZE_MAX) fs.min_values = 0;
    if (fs.min_bytes == SIZE_MAX) fs.min_bytes = 0;
  }
  return s;
}

}  // namespace hpm::data
