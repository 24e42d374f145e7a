// Token shards: the format round trip (u16 and u32 ids), sequences over several shards
// (windows that span two), and every documented error, each naming the file and the byte.
#include "hpm/data/token_shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/errors.h"
#include "common/hpm_cli.h"
#include "common/temp_dir.h"
#include "hpm/data/text_corpus.h"
#include "hpm/io/crc32c.h"

namespace hpm::data {
namespace {

using hpm::testing::read_text;
using hpm::testing::TempDir;

std::vector<std::int64_t> iota(std::int64_t n, std::int64_t from = 0, std::int64_t mod = 0) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = mod ? (from + i) % mod : from + i;
  return v;
}

std::vector<std::int64_t> all(const TokenSequence& s) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(s.size()));
  s.read(0, s.size(), v.data());
  return v;
}

using hpm::testing::error_of;

// Overwrites bytes of a file at `offset`; with `fix_header`, the header checksum is recomputed so
// that the damage reaches the check after it.
void patch(const std::string& path, std::size_t offset, const void* bytes, std::size_t n,
           bool fix_header = false) {
  std::string file = read_text(path);
  std::memcpy(file.data() + offset, bytes, n);
  if (fix_header) {
    const std::uint32_t crc = io::crc32c(file.data(), 60);
    std::memcpy(file.data() + 60, &crc, 4);
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
}

TEST(TokenShard, RoundTripsU16AndU32) {
  TempDir dir;
  const auto ids = iota(1000, 0, 300);
  write_token_shard(dir / "a.tokens", ids, 300, 0xabcd);
  const auto a = TokenShard::open(dir / "a.tokens");
  EXPECT_EQ(a->header().token_bytes, 2u);
  EXPECT_EQ(a->vocab_size(), 300);
  EXPECT_EQ(a->size(), 1000);
  EXPECT_EQ(a->header().tokenizer, 0xabcdu);
  EXPECT_EQ(std::filesystem::file_size(dir / "a.tokens"), 64u + 2000u);
  EXPECT_EQ(all(TokenSequence({a})), ids);
  const TokenShardHeader h = read_token_shard_header(dir / "a.tokens");
  EXPECT_EQ(h.count, 1000);
  EXPECT_EQ(h.payload_crc32c, a->header().payload_crc32c);

  const std::vector<std::int64_t> wide = {0, 65535, 65536, 69999};
  write_token_shard(dir / "b.tokens", wide, 70000, 0);
  const auto b = TokenShard::open(dir / "b.tokens");
  EXPECT_EQ(b->header().token_bytes, 4u) << "past 65,536 tokens ids take 4 bytes";
  EXPECT_EQ(all(TokenSequence({b})), wide);
  EXPECT_EQ(token_width(65536), 2u);
  EXPECT_EQ(token_width(65537), 4u);

  write_token_shard(dir / "empty.tokens", {}, 256, 0);
  EXPECT_EQ(TokenShard::open(dir / "empty.tokens")->size(), 0);
  EXPECT_NE(error_of([&] {
              write_token_shard(dir / "c.tokens", {1, 300}, 300, 0);
            }).find("token 300 at index 1 is outside the vocabulary of 300"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "c.tokens"));
}

TEST(TokenShard, SequencesSpanShardsAndWindowsReadThemAsOneTensor) {
  TempDir dir;
  std::filesystem::create_directories(dir / "s");
  write_token_shard(dir / "s/train-00000.tokens", iota(50, 0), 256, 7);
  write_token_shard(dir / "s/train-00001.tokens", iota(30, 50), 256, 7);
  write_token_shard(dir / "s/val-00000.tokens", iota(40, 100), 256, 7);
  const TokenCorpus c = load_token_shards(dir / "s/train-*.tokens", dir / "s/val-*.tokens");
  EXPECT_EQ(c.train_files.size(), 2u);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_EQ(c.tokenizer, 7u);
  EXPECT_EQ(all(c.train), iota(80, 0));
  std::vector<std::int64_t> across(10);
  c.train.read(45, 10, across.data());
  EXPECT_EQ(across, iota(10, 45)) << "a read across the boundary";
  EXPECT_EQ(c.train.to_tensor().to_vector_i64(), iota(80, 0));
  // The same windows from the mapped shards as from one tensor of their tokens.
  const Tensor flat = Tensor::from_i64(iota(80, 0), Shape{80});
  auto mapped = random_windows(c.train, 8, 4, 3).make_iterator();
  auto memory = random_windows(flat, 8, 4, 3).make_iterator();
  Element a, b;
  for (int k = 0; k < 20; ++k) {
    ASSERT_TRUE(mapped->next(a));
    ASSERT_TRUE(memory->next(b));
    EXPECT_EQ(a[0].to_vector_i64(), b[0].to_vector_i64());
    EXPECT_EQ(a[1].to_vector_i64(), b[1].to_vector_i64());
  }
  auto sweep = sequential_windows(c.val, 8, 2).make_iterator();
  ASSERT_TRUE(sweep->next(a));
  EXPECT_EQ(a[1].to_vector_i64()[0], 101);
}

// A shard truncated in place under a run that reads it: a DataError naming the file and the byte
// (mapped, the read was a SIGBUS naming nothing). One replaced by rename keeps serving the file
// that was opened.
TEST(TokenShard, AShardTruncatedWhileOpenIsAnErrorNamingIt) {
  TempDir dir;
  write_token_shard(dir / "a.tokens", iota(5000, 0, 300), 300, 0);
  const auto a = TokenShard::open(dir / "a.tokens");
  std::filesystem::resize_file(dir / "a.tokens", 64 + 2 * 1000);
  std::vector<std::int64_t> out(10);
  a->read(990, 10, out.data());
  EXPECT_EQ(out, iota(10, 990, 300));
  const std::string e = error_of([&] { a->read(4000, 10, out.data()); });
  EXPECT_NE(e.find(dir / "a.tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("byte 8064"), std::string::npos) << e;
  EXPECT_NE(e.find("the file ends early: it was truncated or replaced in place"), std::string::npos)
      << e;

  write_token_shard(dir / "b.tokens", iota(100, 0, 300), 300, 0);
  const auto b = TokenShard::open(dir / "b.tokens");
  write_token_shard(dir / "b.tokens", iota(10, 200, 300), 300, 0);  // a new file, renamed over
  b->read(90, 10, out.data());
  EXPECT_EQ(out, iota(10, 90, 300));
}

TEST(TokenShard, DocumentedErrorsNameTheFileAndTheByte) {
  TempDir dir;
  const std::string good = dir / "good.tokens";
  write_token_shard(good, iota(100, 0, 256), 256, 0);
  const std::string bytes = read_text(good);
  const auto fresh = [&](const std::string& name) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  };
  const auto open_error = [](const std::string& path) {
    return error_of([&] { TokenShard::open(path); });
  };
  const auto expect = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << message;
  };

  std::string path = fresh("magic.tokens");
  patch(path, 0, "HPMTOKEX", 8);
  expect(open_error(path),
         path + ": byte 0: not an hpm token shard: magic \"HPMTOKEX\", expected \"HPMTOKEN\"");

  path = fresh("version.tokens");
  const std::uint32_t v2 = 2;
  patch(path, 8, &v2, 4);
  expect(open_error(path),
         path + ": byte 8: version 2 is not supported (this hpm reads version 1)");

  path = fresh("header.tokens");
  const std::uint64_t vocab = 512;
  patch(path, 16, &vocab, 8);
  expect(open_error(path), path + ": byte 60: header checksum mismatch: stored 0x");
  expect(error_of([&] { read_token_shard_header(path); }), "byte 60: header checksum mismatch");

  path = fresh("width.tokens");
  const std::uint32_t w3 = 3;
  patch(path, 12, &w3, 4, true);
  expect(open_error(path), path + ": byte 12: token width 3 bytes, expected 2 (u16) or 4 (u32)");

  path = fresh("truncated.tokens");
  std::filesystem::resize_file(path, 64 + 150);
  expect(open_error(path), path +
                               ": truncated: the header (byte 24) counts 100 tokens of 2 bytes, "
                               "264 bytes in all; the file holds 214");
  expect(error_of([&] { read_token_shard_header(path); }), "truncated");
  std::filesystem::resize_file(path, 10);
  expect(open_error(path),
         path + ": truncated: 10 bytes, shorter than the 64-byte header of a token shard");

  path = fresh("long.tokens");
  std::ofstream(path, std::ios::app) << "xx";
  expect(open_error(path), path + ": too long: the header (byte 24) counts 100 tokens");

  path = fresh("payload.tokens");
  const std::uint16_t seven = 7;
  patch(path, 64 + 2 * 50, &seven, 2);
  expect(open_error(path), path +
                               ": byte 64: payload checksum mismatch: the header (byte 32) says "
                               "0x");
  expect(open_error(path), "the 100 tokens hash to 0x");
  EXPECT_NO_THROW(read_token_shard_header(path)) << "the header alone is sound";

  path = fresh("range.tokens");  // a shard whose checksums hold over an id past the vocabulary
  const std::uint16_t big = 300;
  patch(path, 64 + 2 * 10, &big, 2);
  std::string file = read_text(path);
  const std::uint32_t crc = io::crc32c(file.data() + 64, 200);
  patch(path, 32, &crc, 4, true);
  expect(open_error(path), path +
                               ": byte 84: token 300 (index 10) is outside the vocabulary of 256 "
                               "(byte 16)");

  expect(open_error(dir / "none.tokens"), dir / "none.tokens: cannot open");
  expect(error_of([&] { load_token_shards(dir / "nothing-*.tokens", good); }),
         dir / "nothing-*.tokens: no token shard matches");
  write_token_shard(dir / "other-vocab.tokens", iota(10), 300, 0);
  expect(error_of([&] { load_token_shards(good, dir / "other-vocab.tokens"); }),
         dir / "other-vocab.tokens: byte 16: vocabulary size 300, but " + good +
             " has 256: shards of one corpus share a tokenizer");
  write_token_shard(dir / "other-tok.tokens", iota(10), 256, 5);
  expect(error_of([&] { load_token_shards(good, dir / "other-tok.tokens"); }),
         dir / "other-tok.tokens: byte 36: tokenizer 0x00000005, but " + good +
             " was made by 0x00000000");
  // A training glob that also matches the validation shard: validation on training data.
  write_token_shard(dir / "val-0.tokens", iota(10), 256, 0);
  expect(error_of([&] { load_token_shards(dir / "*-0.tokens", dir / "val-0.tokens"); }),
         dir / "val-0.tokens: is matched by both the training files ('" + dir / "*-0.tokens" +
             "') and the validation files");
}

}  // namespace
}  // namespace hpm::data
