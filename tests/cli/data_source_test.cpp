// The [data] sources as a user meets them: the TFRecord source honours train_limit, counts its
// examples and refuses an empty set; training data without a batch is bad input (exit 1);
// a compressed file read without `compression` says which setting to use; a cache file written
// for other data settings is refused, naming the difference.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/hpm_cli.h"
#include "hpm/io/tfrecord.h"

namespace hpm::testing {
namespace {

// 64 training and 16 test examples as IDX files in dir, and as TFRecord shards in dir/tfr.
struct Converted {
  TempDir dir;
  std::string config;
  Converted(const std::string& compression = "none") {
    write_synthetic_mnist(dir.path(), 64, 16);
    config = small_mlp_config(dir, dir.path(), "");
    const CommandResult c = run_hpm("data convert --dir " + dir.path() + " --out " + dir / "tfr" +
                                    " --shards 2 --compression " + compression);
    EXPECT_EQ(c.code, 0) << c.output;
  }
  std::string tfrecord(const std::string& files) const {
    return "--set data.source=tfrecord --set data.files=" + files +
           " --set data.test_files=" + dir / "tfr/t10k-*";
  }
};

TEST(DataSource, TfRecordHonoursTrainLimitAndCountsItsExamples) {
  Converted c;
  const CommandResult r =
      run_hpm("train " + c.config + " --set train.epochs=2 " + c.tfrecord(c.dir / "tfr/train-*") +
              " --set data.train_limit=32 --report " + c.dir / "r.json");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(", 32 training / 16 test examples"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("/-2"), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(read_text(c.dir / "r.json"));
  EXPECT_EQ(j["steps"].get<int>(), 2 * 32 / 16);
  // Without a limit: all 64, counted.
  const CommandResult all =
      run_hpm("train " + c.config + " --set train.epochs=1 " + c.tfrecord(c.dir / "tfr/train-*"));
  ASSERT_EQ(all.code, 0) << all.output;
  EXPECT_NE(all.output.find(", 64 training / 16 test examples"), std::string::npos) << all.output;
}

TEST(DataSource, AnEmptyTrainingSetIsRefused) {
  Converted c;
  io::TfRecordWriter(c.dir / "empty.tfrecord").close();
  const CommandResult r =
      run_hpm("train " + c.config + " --set train.checkpoint_dir=" + c.dir / "ckpt " +
              c.tfrecord(c.dir / "empty.tfrecord"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("[data] files = \"" + c.dir / "empty.tfrecord" +
                          "\": no training example (the files hold no record)"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(c.dir / "ckpt")) << "an untrained checkpoint was saved";
}

TEST(DataSource, NoTrainingBatchIsBadInputNotANonFiniteLoss) {
  Converted c;
  // 64 examples, batches of 128 without the remainder: no batch at all.
  const CommandResult r = run_hpm("train " + c.config + " --set data.batch_size=128");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("the training data yields no batch"), std::string::npos) << r.output;
  // The same through the TFRecord source, whose length the trainer does not know.
  const CommandResult t = run_hpm("train " + c.config + " --set data.batch_size=128 " +
                                  c.tfrecord(c.dir / "tfr/train-*"));
  EXPECT_EQ(t.code, 1) << t.output;
  EXPECT_NE(t.output.find("the training data yields no batch in epoch 1"), std::string::npos)
      << t.output;
}

TEST(DataSource, ACompressedFileReadWithoutCompressionNamesTheSetting) {
  for (const std::string kind : {"gzip", "zlib"}) {
    SCOPED_TRACE(kind);
    Converted c(kind);
    const std::string file = c.dir / ("tfr/train-00000-of-00002.tfrecord." +
                                      std::string(kind == "gzip" ? "gz" : "zlib"));
    const CommandResult r = run_hpm("data inspect " + file);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("length CRC mismatch"), std::string::npos) << r.output;
    const std::string hint =
        kind == "gzip"
            ? "the file starts with gzip's magic bytes 1f 8b: it is compressed, read it with "
              "compression GZIP ([data] compression = \"gzip\", --compression gzip)"
            : "the file starts with the zlib header 78 9c: it is compressed, read it with "
              "compression ZLIB ([data] compression = \"zlib\", --compression zlib)";
    EXPECT_NE(r.output.find(hint), std::string::npos) << r.output;
    // Training says so too, before any step.
    const CommandResult t = run_hpm("train " + c.config + " " + c.tfrecord(c.dir / "tfr/train-*"));
    EXPECT_EQ(t.code, 1) << t.output;
    EXPECT_NE(t.output.find(hint), std::string::npos) << t.output;
  }
}

TEST(DataSource, ACacheWrittenForOtherDataIsRefused) {
  Converted c;
  const std::string cache = " --set data.cache=\"" + c.dir / "cache.bin" + "\"";
  // IDX rows: train_limit 32, then 48.
  ASSERT_EQ(run_hpm("train " + c.config + cache + " --set data.train_limit=32").code, 0);
  const CommandResult same = run_hpm("train " + c.config + cache + " --set data.train_limit=32");
  EXPECT_EQ(same.code, 0) << same.output;
  CommandResult r = run_hpm("train " + c.config + cache + " --set data.train_limit=48");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("cache: " + c.dir / "cache.bin" + ": written for other data ("),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rows 32 in the cache, 48 now"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("remove it, or give [data] cache another path"), std::string::npos)
      << r.output;
  // TFRecord records: the limit is part of the key.
  const std::string tcache =
      " --set data.cache=\"" + c.dir / "tcache.bin" + "\" " + c.tfrecord(c.dir / "tfr/train-*");
  ASSERT_EQ(run_hpm("train " + c.config + tcache + " --set data.train_limit=32").code, 0);
  r = run_hpm("train " + c.config + tcache + " --set data.train_limit=48");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("limit 32 in the cache, 48 now"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace hpm::testing
