// data::encode_text_to_shards: text files encoded once into shards that read back as the very
// tokens [data] source = "text" gives, cut at the shard size; a directory with shards is refused.
#include "hpm/data/shard_encoding.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/temp_dir.h"
#include "hpm/data/text_corpus.h"
#include "hpm/data/token_shard.h"

namespace hpm::data {
namespace {

TEST(ShardEncoding, ShardsReadBackAsTheTextCorpusTokensCutAtTheShardSize) {
  testing::TempDir dir;
  std::ofstream(dir / "a.txt") << std::string(500, 'a') << "\n";
  std::ofstream(dir / "b.txt") << std::string(300, 'b') << "\n";
  const auto bytes = byte_tokenizer();
  const EncodedCorpus e = encode_text_to_shards(dir / "*.txt", *bytes, dir / "out", 256);
  const TextCorpus text = load_text_corpus(dir / "*.txt", *bytes);
  EXPECT_EQ(e.files, 2u);
  EXPECT_EQ(e.bytes, 802);
  EXPECT_EQ(e.train_tokens, text.train.numel());
  EXPECT_EQ(e.val_tokens, text.val.numel());
  EXPECT_DOUBLE_EQ(e.bytes_per_token(), 1.0) << "bytes are their own tokens";
  EXPECT_EQ(e.train_shards.size(), static_cast<std::size_t>((e.train_tokens + 255) / 256));
  EXPECT_EQ(e.train_shards.front(), dir / "out/train-00000.tokens");
  const TokenCorpus back = load_token_shards(dir / "out/train-*.tokens", dir / "out/val-*.tokens");
  EXPECT_EQ(back.train.to_tensor().to_vector_i64(), text.train.to_vector_i64());
  EXPECT_EQ(back.val.to_tensor().to_vector_i64(), text.val.to_vector_i64());
  EXPECT_EQ(back.tokenizer, bytes->fingerprint());

  // Another run into the same directory would mix its shards with these: refused, nothing lost.
  try {
    encode_text_to_shards(dir / "*.txt", *bytes, dir / "out", 256);
    FAIL() << "a directory of shards was written over";
  } catch (const std::invalid_argument& err) {
    EXPECT_NE(std::string(err.what()).find("already holds token shards"), std::string::npos)
        << err.what();
  }
  EXPECT_EQ(load_token_shards(dir / "out/train-*.tokens", dir / "out/val-*.tokens")
                .train.to_tensor()
                .to_vector_i64(),
            text.train.to_vector_i64());
}

}  // namespace
}  // namespace hpm::data
