// `hpm data convert`'s writer: the labels it stores are those training reads from the IDX files,
// and a labels file that does not match its images is refused before anything is written.
#include "hpm/data/tfrecord_files.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/temp_dir.h"
#include "hpm/data/in_memory.h"
#include "hpm/data/input_pipeline.h"
#include "hpm/io/error.h"
#include "hpm/io/idx.h"

namespace hpm::data {
namespace {

using hpm::testing::TempDir;

// Both splits: `images` 4x4 images, and `labels` stored as IDX type `label_type`.
void write_split_pair(const std::string& dir, std::uint8_t label_type,
                      const std::vector<std::int32_t>& labels, std::int64_t images) {
  for (const char* split : {"train", "t10k"}) {
    io::IdxArray im{io::kIdxU8, {images, 4, 4}, {}};
    for (std::int64_t i = 0; i < images * 16; ++i)
      im.data.push_back(static_cast<unsigned char>(i % 251));
    io::IdxArray lb{label_type, {static_cast<std::int64_t>(labels.size())}, {}};
    for (std::int32_t v : labels) {
      const auto* b = reinterpret_cast<const unsigned char*>(&v);
      if (label_type == io::kIdxU8)
        lb.data.push_back(static_cast<unsigned char>(v));
      else
        lb.data.insert(lb.data.end(), b, b + 4);
    }
    io::write_idx(dir + "/" + split + "-images-idx3-ubyte.gz", im, true);
    io::write_idx(dir + "/" + split + "-labels-idx1-ubyte.gz", lb, true);
  }
}

// Labels stored as 32-bit integers come back whole: the writer took each label's first byte.
TEST(TfRecordFiles, ConvertedLabelsAreTheLabelsTrainingReads) {
  TempDir dir;
  write_split_pair(dir.path(), io::kIdxI32, {1, 2, 300, 4}, 4);
  write_idx_as_tfrecords(dir.path(), dir / "out", 1, io::Compression::None, false);
  const LabelledData converted =
      load_tfrecord_examples(dir / "out/train-00000-of-00001.tfrecord", io::Compression::None);
  EXPECT_EQ(converted.labels.to_vector_i64(), (std::vector<std::int64_t>{1, 2, 300, 4}));
  EXPECT_EQ(converted.labels.to_vector_i64(),
            load_mnist_split(dir.path(), "train").labels.to_vector_i64());
}

// Fewer labels than images: the writer read past the labels' buffer (ASan: heap-buffer-overflow)
// and stored what it found there. Refused, naming the file, and nothing written.
TEST(TfRecordFiles, LabelsThatDoNotMatchTheImagesAreRefusedBeforeWriting) {
  TempDir dir;
  write_split_pair(dir.path(), io::kIdxU8, {7, 8}, 6);
  try {
    write_idx_as_tfrecords(dir.path(), dir / "out", 1, io::Compression::None, false);
    FAIL() << "converted";
  } catch (const io::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("train-labels-idx1-ubyte.gz: expected 6 labels"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out/train-00000-of-00001.tfrecord"));
  write_split_pair(dir.path(), io::kIdxF32, {1, 2}, 2);
  EXPECT_THROW(write_idx_as_tfrecords(dir.path(), dir / "out", 1, io::Compression::None, false),
               io::IoError);
}

}  // namespace
}  // namespace hpm::data
