#include "hpm/io/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "hpm/io/atomic_file.h"
#include "io_test_util.h"

namespace hpm::io {
namespace {

using testing::io_error_of;

template <typename T>
IdxArray make_array(std::uint8_t type, std::vector<std::int64_t> dims, std::vector<T> values) {
  IdxArray a;
  a.type = type;
  a.dims = std::move(dims);
  a.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

class Idx : public testing::TempDirTest {
 protected:
  std::string read_error(const std::string& bytes, const std::string& phrase) {
    const std::string p = path("bad-idx1-ubyte");
    write_raw(p, bytes);
    const std::string msg = io_error_of([&] { read_idx(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, phrase);
    return msg;
  }
};

void expect_same(const IdxArray& a, const IdxArray& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.dims, b.dims);
  EXPECT_EQ(a.data, b.data);
}

TEST_F(Idx, RoundTripAllTypesRawAndGzip) {
  const std::vector<IdxArray> arrays = {
      make_array<std::uint8_t>(kIdxU8, {2, 3}, {0, 1, 2, 127, 128, 255}),
      make_array<std::int8_t>(kIdxI8, {3}, {-128, 0, 127}),
      make_array<std::int16_t>(kIdxI16, {2, 1, 2}, {-32768, -1, 258, 32767}),
      make_array<std::int32_t>(kIdxI32, {2}, {-2147483647 - 1, 16909060}),
      make_array<float>(kIdxF32, {3}, {1.5f, -0.0f, 3e38f}),
      make_array<double>(kIdxF64, {1, 2}, {1e-300, -2.25}),
      make_array<std::uint8_t>(kIdxU8, {0, 28, 28}, {}),
  };
  for (bool gz : {false, true}) {
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      SCOPED_TRACE(std::to_string(i) + (gz ? " gzip" : " raw"));
      std::string name = "a";
      name += std::to_string(i);
      if (gz) name += ".gz";
      const std::string p = path(name);
      write_idx(p, arrays[i], gz);
      const std::string bytes = read_file(p);
      EXPECT_EQ(bytes.substr(0, 2), gz ? "\x1f\x8b" : std::string(2, '\0'));
      expect_same(read_idx(p), arrays[i]);
    }
  }
}

// On disk everything is big-endian.
TEST_F(Idx, ByteExactRawFile) {
  const std::string p = path("i16");
  write_idx(p, make_array<std::int16_t>(kIdxI16, {2, 1}, {0x0102, -2}), false);
  EXPECT_EQ(read_file(p), std::string("\0\0\x0b\x02\0\0\0\x02\0\0\0\x01\x01\x02\xff\xfe", 16));
}

TEST_F(Idx, ReadsConcatenatedGzipMembers) {
  const std::string p = path("multi.gz");
  const std::string raw("\0\0\x08\x01\0\0\0\x04\x0a\x0b\x0c\x0d", 12);
  for (const auto& part : {raw.substr(0, 5), raw.substr(5)}) {
    gzFile f = gzopen(p.c_str(), "ab");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, part.data(), static_cast<unsigned>(part.size())),
              static_cast<int>(part.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  }
  const IdxArray a = read_idx(p);
  EXPECT_EQ(a.dims, std::vector<std::int64_t>({4}));
  EXPECT_EQ(a.data, std::vector<unsigned char>({10, 11, 12, 13}));
}

TEST(IdxConvert, ToF32AndI64) {
  const IdxArray u8 = make_array<std::uint8_t>(kIdxU8, {2, 2}, {0, 51, 255, 102});
  const Tensor f = idx_to_f32(u8, 1.0f / 255);
  EXPECT_EQ(f.dtype(), DType::F32);
  EXPECT_EQ(f.shape(), Shape({2, 2}));
  EXPECT_FLOAT_EQ(f.to_vector()[1], 0.2f);
  EXPECT_FLOAT_EQ(f.to_vector()[2], 1.0f);
  const Tensor l = idx_to_i64(u8);
  EXPECT_EQ(l.dtype(), DType::I64);
  EXPECT_EQ(l.to_vector_i64(), std::vector<std::int64_t>({0, 51, 255, 102}));

  const IdxArray i16 = make_array<std::int16_t>(kIdxI16, {2}, {-300, 7});
  EXPECT_EQ(idx_to_i64(i16).to_vector_i64(), std::vector<std::int64_t>({-300, 7}));
  EXPECT_EQ(idx_to_f32(i16, 2).to_vector(), std::vector<float>({-600, 14}));
  const IdxArray i8 = make_array<std::int8_t>(kIdxI8, {1}, {-5});
  EXPECT_EQ(idx_to_i64(i8).to_vector_i64(), std::vector<std::int64_t>({-5}));
  const IdxArray f64 = make_array<double>(kIdxF64, {1}, {0.5});
  EXPECT_EQ(idx_to_f32(f64).to_vector(), std::vector<float>({0.5f}));
}

TEST(IdxConvert, ToI64RejectsFloats) {
  const IdxArray f32 = make_array<float>(kIdxF32, {1}, {0.5f});
  EXPECT_CONTAINS(io_error_of([&] { idx_to_i64(f32); }), "is not an integer type");
}

TEST(IdxConvert, RejectsInconsistentArray) {
  const IdxArray bad = make_array<std::uint8_t>(kIdxU8, {3}, {1, 2});
  EXPECT_CONTAINS(io_error_of([&] { idx_to_f32(bad); }), "data has 2 bytes but dims [3]");
}

TEST_F(Idx, ErrorWrongMagic) {
  read_error(std::string("\x01\x02\x08\x01\0\0\0\x01\x05", 9),
             "bad IDX magic at offset 0: expected 0x0000, found 0x0102");
}

TEST_F(Idx, ErrorTooShortForHeader) {
  read_error(std::string("\0\0", 2), "expected at least 4 bytes, found 2");
}

TEST_F(Idx, ErrorUnknownType) {
  read_error(std::string("\0\0\x07\x01\0\0\0\x01\x05", 9),
             "unknown IDX type byte 0x07 at offset 2");
}

TEST_F(Idx, ErrorZeroDimensions) {
  read_error(std::string("\0\0\x08\x00", 4), "dimension count at offset 3 is 0");
}

// Found by fuzz/idx_fuzz.cpp: a zero dimension made the byte count 0, so huge other dimensions
// passed, and the shape's element count overflowed (undefined behaviour) when the array was used.
TEST_F(Idx, ErrorHugeDimensionsBesideAZeroOne) {
  read_error(std::string("\0\0\x08\x03\xff\xff\xff\xff\0\0\0\0\xff\xff\xff\xff", 16),
             "dimensions [4294967295, 0, 4294967295] are too large");
  // A zero dimension among reasonable ones is an empty array, as before.
  const std::string p = path("empty-idx1-ubyte");
  write_raw(p, std::string("\0\0\x08\x02\0\0\0\x03\0\0\0\0", 12));
  EXPECT_EQ(read_idx(p).dims, (std::vector<std::int64_t>{3, 0}));
}

TEST_F(Idx, ErrorTruncatedDimensions) {
  read_error(std::string("\0\0\x08\x03\0\0\0\x01\0\0", 10),
             "truncated header: expected 3 dimensions (12 bytes) at offset 4, found 6 bytes");
}

TEST_F(Idx, ErrorTruncatedRawData) {
  read_error(std::string("\0\0\x0b\x01\0\0\0\x03\0\x01\0\x02", 12),
             "truncated: expected 6 bytes of data (dims [3] of i16) at offset 8, found 4");
}

TEST_F(Idx, ErrorTrailingBytes) {
  read_error(std::string("\0\0\x08\x01\0\0\0\x02\x01\x02\x03\x04", 12),
             "2 trailing bytes at offset 10 after the data: expected 2 bytes of data");
}

TEST_F(Idx, ErrorTruncatedGzip) {
  std::vector<std::uint8_t> pixels(5000);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i * i);
  const std::string good = path("good.gz");
  write_idx(good, make_array<std::uint8_t>(kIdxU8, {5, 1000}, pixels), true);
  const std::string gz = read_file(good);
  // Chopped in the middle of the deflate stream, and inside the 8-byte trailer.
  for (std::size_t keep : {gz.size() / 2, gz.size() - 3}) {
    SCOPED_TRACE(keep);
    read_error(gz.substr(0, keep), "gzip data is truncated or corrupt");
  }
}

TEST_F(Idx, ErrorCorruptGzip) {
  const std::string good = path("good.gz");
  write_idx(good, make_array<std::uint8_t>(kIdxU8, {4}, {1, 2, 3, 4}), true);
  std::string gz = read_file(good);
  gz[gz.size() - 6] = static_cast<char>(gz[gz.size() - 6] ^ 0x55);  // the CRC in the trailer
  read_error(gz, "gzip data is corrupt at compressed offset");
}

TEST_F(Idx, ErrorTruncatedGzippedData) {
  // A valid gzip whose decompressed IDX is short: offsets refer to the decompressed data.
  const std::string p = path("short.gz");
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, "\0\0\x08\x01\0\0\0\x05\x01", 9), 9);
  ASSERT_EQ(gzclose(f), Z_OK);
  const std::string msg = io_error_of([&] { read_idx(p); });
  EXPECT_CONTAINS(msg, p + " (decompressed)");
  EXPECT_CONTAINS(msg, "truncated: expected 5 bytes of data");
}

TEST_F(Idx, MissingFile) {
  const std::string p = path("absent.gz");
  EXPECT_CONTAINS(io_error_of([&] { read_idx(p); }), "cannot open " + p);
}

const std::string kFashion = "/usr/share/datasets/fashion-mnist/";

TEST(IdxFashionMnist, TestLabels) {
  const std::string p = kFashion + "t10k-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << p << " not present";
  const IdxArray a = read_idx(p);
  EXPECT_EQ(a.type, kIdxU8);
  ASSERT_EQ(a.dims, std::vector<std::int64_t>({10000}));
  const Tensor labels = idx_to_i64(a);
  std::vector<int> counts(10, 0);
  for (std::int64_t v : labels.to_vector_i64()) {
    ASSERT_GE(v, 0);
    ASSERT_LE(v, 9);
    ++counts[static_cast<std::size_t>(v)];
  }
  for (int c : counts) EXPECT_EQ(c, 1000);  // the test split is balanced
}

TEST(IdxFashionMnist, TestImages) {
  const std::string p = kFashion + "t10k-images-idx3-ubyte.gz";
  if (!std::filesystem::exists(p)) GTEST_SKIP() << p << " not present";
  const IdxArray a = read_idx(p);
  EXPECT_EQ(a.type, kIdxU8);
  ASSERT_EQ(a.dims, std::vector<std::int64_t>({10000, 28, 28}));
  const Tensor x = idx_to_f32(a, 1.0f / 255);
  EXPECT_EQ(x.shape(), Shape({10000, 28, 28}));
  const float* d = x.data<float>();
  float lo = 1, hi = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    lo = std::min(lo, d[i]);
    hi = std::max(hi, d[i]);
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
}

}  // namespace
}  // namespace hpm::io
