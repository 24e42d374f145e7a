#include "hpm/io/tfrecord.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hpm/io/atomic_file.h"
#include "hpm/io/crc32c.h"
#include "io/io_test_util.h"

namespace hpm::io {
namespace {

using testing::io_error_of;

const std::string kFixtures = std::string(HPM_SOURCE_DIR) + "/tests/io/fixtures/";

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// Records of assorted sizes, including empty ones and ones larger than the reader's buffer.
std::vector<std::string> sample_records() {
  std::vector<std::string> records;
  const std::size_t sizes[] = {0, 1, 7, 100, 4096, 0, 300000, 13, 65536, 2};
  unsigned state = 12345;
  for (std::size_t n : sizes) {
    std::string r(n, '\0');
    for (auto& c : r) {
      state = state * 1103515245u + 12345u;
      c = static_cast<char>(state >> 16);
    }
    records.push_back(r);
  }
  return records;
}

struct Written {
  std::vector<std::uint64_t> offsets;  // start of each record
  std::uint64_t end = 0;
};

Written write_records(const std::string& path, const std::vector<std::string>& records,
                      Compression c) {
  Written w;
  TfRecordWriter writer(path, c);
  for (const auto& r : records) {
    w.offsets.push_back(writer.offset());
    writer.write(r);
  }
  w.end = writer.offset();
  writer.close();
  return w;
}

// One-shot zlib inflate of a whole zlib (Zlib) or gzip (Gzip) stream; None returns the input.
std::string inflate_all(const std::string& in, Compression c) {
  if (c == Compression::None) return in;
  z_stream zs{};
  EXPECT_EQ(inflateInit2(&zs, c == Compression::Gzip ? 31 : 15), Z_OK);
  std::string out(in.size() * 20 + 1024, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(inflate(&zs, Z_FINISH), Z_STREAM_END);
  EXPECT_EQ(zs.avail_in, 0u);
  out.resize(zs.total_out);
  inflateEnd(&zs);
  return out;
}

std::string small_record(int i) { return "record number " + std::to_string(i); }

class TfRecordTest : public testing::TempDirTest {
 protected:
  // Three small records in an uncompressed file; returns their offsets.
  std::vector<std::uint64_t> write_three(const std::string& p) {
    return write_records(p, {small_record(0), small_record(1), small_record(2)}, Compression::None)
        .offsets;
  }
};

TEST(CompressionTest, Names) {
  EXPECT_EQ(compression_from_name(""), Compression::None);
  EXPECT_EQ(compression_from_name("NONE"), Compression::None);
  EXPECT_EQ(compression_from_name("ZLIB"), Compression::Zlib);
  EXPECT_EQ(compression_from_name("GZIP"), Compression::Gzip);
  EXPECT_STREQ(compression_name(Compression::Gzip), "GZIP");
  EXPECT_CONTAINS(io_error_of([] { compression_from_name("LZ4"); }), "'LZ4'");
}

TEST_F(TfRecordTest, FramingIsTensorFlows) {
  const std::string p = path("one.tfrecord");
  write_records(p, {"hello"}, Compression::None);
  const std::string bytes = read_raw(p);
  ASSERT_EQ(bytes.size(), 12u + 5u + 4u);
  std::string len("\x05\0\0\0\0\0\0\0", 8);
  EXPECT_EQ(bytes.substr(0, 8), len);
  const std::uint32_t lcrc = masked_crc32c(len.data(), 8);
  const std::uint32_t dcrc = masked_crc32c("hello", 5);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(static_cast<unsigned char>(bytes[8 + i]), (lcrc >> (8 * i)) & 0xFF);
    EXPECT_EQ(static_cast<unsigned char>(bytes[17 + i]), (dcrc >> (8 * i)) & 0xFF);
  }
  EXPECT_EQ(bytes.substr(12, 5), "hello");
}

class TfRecordRoundTrip : public testing::TempDirTest,
                          public ::testing::WithParamInterface<Compression> {};

TEST_P(TfRecordRoundTrip, WritesAndReadsBack) {
  const std::string p = path("data.tfrecord");
  const auto records = sample_records();
  const Written w = write_records(p, records, GetParam());
  EXPECT_EQ(listing(), std::vector<std::string>{"data.tfrecord"});  // no temporary left

  TfRecordReader reader(p, GetParam());
  std::string r;
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(reader.offset(), w.offsets[i]);
    ASSERT_TRUE(reader.next(r)) << i;
    EXPECT_EQ(r, records[i]) << i;
  }
  EXPECT_EQ(reader.offset(), w.end);
  EXPECT_FALSE(reader.next(r));
  EXPECT_FALSE(reader.next(r));
  EXPECT_EQ(read_tfrecord_file(p, GetParam()), records);

  // Decompressed independently of InputStream, the file holds exactly the uncompressed framing.
  const std::string raw = read_raw(p);
  write_records(path("plain"), records, Compression::None);
  EXPECT_EQ(inflate_all(raw, GetParam()), read_raw(path("plain")));
  if (GetParam() == Compression::Gzip) {
    EXPECT_EQ(static_cast<unsigned char>(raw[0]), 0x1f);
    EXPECT_EQ(static_cast<unsigned char>(raw[1]), 0x8b);
  } else if (GetParam() == Compression::Zlib) {
    EXPECT_EQ(static_cast<unsigned char>(raw[0]), 0x78);  // zlib header, deflate 32K window
    EXPECT_EQ((static_cast<unsigned char>(raw[0]) * 256 + static_cast<unsigned char>(raw[1])) % 31,
              0);
  } else {
    EXPECT_EQ(raw.size(), w.end);
  }
}

TEST_P(TfRecordRoundTrip, SeekResumesAtSavedOffsets) {
  const std::string p = path("data.tfrecord");
  const auto records = sample_records();
  const Written w = write_records(p, records, GetParam());
  TfRecordReader reader(p, GetParam());
  std::string r;
  // Forward, backward, to the start and to the end.
  for (std::size_t i : {5u, 2u, 9u, 0u, 6u, 6u}) {
    reader.seek(w.offsets[i]);
    EXPECT_EQ(reader.offset(), w.offsets[i]);
    ASSERT_TRUE(reader.next(r));
    EXPECT_EQ(r, records[i]) << i;
  }
  reader.seek(w.end);
  EXPECT_FALSE(reader.next(r));
  reader.seek(w.offsets[3]);  // seek clears the end-of-file state
  ASSERT_TRUE(reader.next(r));
  EXPECT_EQ(r, records[3]);
  const std::string msg = io_error_of([&] { reader.seek(w.end + 10); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, std::to_string(w.end + 10));
}

TEST_P(TfRecordRoundTrip, EmptyFileHasNoRecords) {
  const std::string p = path("empty.tfrecord");
  write_records(p, {}, GetParam());
  TfRecordReader reader(p, GetParam());
  std::string r;
  EXPECT_FALSE(reader.next(r));
  write_raw(path("zero"), "");
  TfRecordReader zero(path("zero"), GetParam());
  EXPECT_FALSE(zero.next(r));
}

INSTANTIATE_TEST_SUITE_P(AllCompressions, TfRecordRoundTrip,
                         ::testing::Values(Compression::None, Compression::Zlib, Compression::Gzip),
                         [](const auto& info) {
                           return std::string(compression_name(info.param));
                         });

class TfRecordFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(TfRecordFixture, ReadsPythonWrittenFileExactly) {
  const auto doc = nlohmann::json::parse(read_file(kFixtures + "examples.json"));
  const Compression c = compression_from_name(GetParam());
  const std::string p = kFixtures + doc["files"][GetParam()].get<std::string>();
  TfRecordReader reader(p, c);
  std::string r;
  for (const auto& rec : doc["records"]) {
    EXPECT_EQ(reader.offset(), rec["offset"].get<std::uint64_t>());
    ASSERT_TRUE(reader.next(r));
    EXPECT_EQ(r.size(), rec["length"].get<std::size_t>());
    EXPECT_EQ(r, from_hex(rec["hex"].get<std::string>()));
  }
  EXPECT_FALSE(reader.next(r));
  EXPECT_EQ(reader.offset(), doc["uncompressed_size"].get<std::uint64_t>());

  // Seek to the last record of the Python file.
  const auto& last = doc["records"].back();
  reader.seek(last["offset"].get<std::uint64_t>());
  ASSERT_TRUE(reader.next(r));
  EXPECT_EQ(r, from_hex(last["hex"].get<std::string>()));
}

INSTANTIATE_TEST_SUITE_P(Python, TfRecordFixture, ::testing::Values("NONE", "ZLIB", "GZIP"),
                         [](const auto& info) { return info.param; });

TEST_F(TfRecordTest, WriterMatchesPythonBytes) {
  const auto doc = nlohmann::json::parse(read_file(kFixtures + "examples.json"));
  std::vector<std::string> records;
  for (const auto& rec : doc["records"]) records.push_back(from_hex(rec["hex"].get<std::string>()));
  write_records(path("ours.tfrecord"), records, Compression::None);
  EXPECT_EQ(read_raw(path("ours.tfrecord")), read_file(kFixtures + "examples.tfrecord"));
}

TEST_F(TfRecordTest, CorruptLengthCrcNamesFileAndOffsetThenEndsTheStream) {
  const std::string p = path("bad.tfrecord");
  const auto off = write_three(p);
  std::string bytes = read_raw(p);
  bytes[off[1] + 9] ^= 0x01;  // a byte of record 1's length CRC
  write_raw(p, bytes);

  TfRecordReader reader(p);
  std::string r;
  ASSERT_TRUE(reader.next(r));
  const std::string msg = io_error_of([&] { reader.next(r); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "corrupt record at byte " + std::to_string(off[1]));
  EXPECT_CONTAINS(msg, "length CRC mismatch");
  EXPECT_FALSE(reader.next(r));  // cannot resynchronize
}

TEST_F(TfRecordTest, CorruptLengthIsALengthCrcError) {
  const std::string p = path("bad.tfrecord");
  const auto off = write_three(p);
  std::string bytes = read_raw(p);
  bytes[off[2] + 3] = '\x7f';  // a huge length: must not allocate it or read past
  write_raw(p, bytes);
  TfRecordReader reader(p);
  std::string r;
  ASSERT_TRUE(reader.next(r));
  ASSERT_TRUE(reader.next(r));
  EXPECT_CONTAINS(io_error_of([&] { reader.next(r); }),
                  "corrupt record at byte " + std::to_string(off[2]) + ": length CRC");
  EXPECT_FALSE(reader.next(r));

  // Without CRC checks the bogus length is read as a truncated record.
  TfRecordReader unchecked(p, Compression::None, /*verify_crc=*/false);
  ASSERT_TRUE(unchecked.next(r));
  ASSERT_TRUE(unchecked.next(r));
  EXPECT_CONTAINS(io_error_of([&] { unchecked.next(r); }),
                  "truncated record at byte " + std::to_string(off[2]));
}

TEST_F(TfRecordTest, CorruptDataCrcCanBeSkipped) {
  const std::string p = path("bad.tfrecord");
  const auto off = write_three(p);
  std::string bytes = read_raw(p);
  bytes[off[1] + 12 + 3] ^= 0x20;  // a data byte of record 1
  write_raw(p, bytes);

  TfRecordReader reader(p);
  std::string r;
  ASSERT_TRUE(reader.next(r));
  EXPECT_EQ(r, small_record(0));
  const std::string msg = io_error_of([&] { reader.next(r); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "corrupt record at byte " + std::to_string(off[1]));
  EXPECT_CONTAINS(msg, "data CRC mismatch");
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(reader.offset(), off[2]);
  ASSERT_TRUE(reader.next(r));  // skips the bad record
  EXPECT_EQ(r, small_record(2));
  EXPECT_FALSE(reader.next(r));

  // verify_crc = false returns the corrupt bytes.
  TfRecordReader unchecked(p, Compression::None, false);
  ASSERT_TRUE(unchecked.next(r));
  ASSERT_TRUE(unchecked.next(r));
  EXPECT_NE(r, small_record(1));
  EXPECT_EQ(r.size(), small_record(1).size());
}

TEST_F(TfRecordTest, CorruptDataCrcInCompressedFileCanBeSkipped) {
  const std::string plain = path("plain.tfrecord");
  const auto off = write_three(plain);
  std::string bytes = read_raw(plain);
  bytes[off[1] + 14] ^= 0x01;  // a data byte of record 1
  // Gzip the corrupt stream with zlib directly.
  std::string gz(compressBound(bytes.size()) + 64, '\0');
  z_stream zs{};
  ASSERT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
  zs.next_in = reinterpret_cast<Bytef*>(bytes.data());
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(gz.data());
  zs.avail_out = static_cast<uInt>(gz.size());
  ASSERT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  gz.resize(zs.total_out);
  deflateEnd(&zs);
  const std::string p = path("bad.tfrecord.gz");
  write_raw(p, gz);

  TfRecordReader reader(p, Compression::Gzip);
  std::string r;
  ASSERT_TRUE(reader.next(r));
  EXPECT_CONTAINS(io_error_of([&] { reader.next(r); }),
                  "corrupt record at byte " + std::to_string(off[1]) + ": data CRC");
  ASSERT_TRUE(reader.next(r));
  EXPECT_EQ(r, small_record(2));
}

TEST_F(TfRecordTest, TruncatedRecordNamesExpectedBytes) {
  const std::string p = path("short.tfrecord");
  const auto off = write_three(p);
  const std::string full = read_raw(p);
  const std::size_t rec2 = 16 + small_record(2).size();
  write_raw(p, full.substr(0, full.size() - 5));  // cut inside record 2's data

  TfRecordReader reader(p);
  std::string r;
  ASSERT_TRUE(reader.next(r));
  ASSERT_TRUE(reader.next(r));
  const std::string msg = io_error_of([&] { reader.next(r); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "truncated record at byte " + std::to_string(off[2]) + ": expected " +
                           std::to_string(rec2) + " bytes, found " + std::to_string(rec2 - 5));
  EXPECT_FALSE(reader.next(r));

  write_raw(p, full.substr(0, off[2] + 7));  // cut inside the header
  TfRecordReader header(p);
  ASSERT_TRUE(header.next(r));
  ASSERT_TRUE(header.next(r));
  EXPECT_CONTAINS(io_error_of([&] { header.next(r); }),
                  "truncated record at byte " + std::to_string(off[2]) +
                      ": expected a 12-byte record header, found 7");
}

TEST_F(TfRecordTest, TruncatedCompressedStream) {
  const std::string p = path("data.tfrecord.gz");
  write_records(p, sample_records(), Compression::Gzip);
  const std::string full = read_raw(p);
  write_raw(p, full.substr(0, full.size() / 2));
  const std::string msg = io_error_of([&] { read_tfrecord_file(p, Compression::Gzip); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "GZIP stream is truncated");

  // Plain data read as ZLIB: a clear error, not garbage.
  const std::string plain = path("plain.tfrecord");
  write_three(plain);
  EXPECT_CONTAINS(io_error_of([&] { read_tfrecord_file(plain, Compression::Zlib); }),
                  "corrupt ZLIB data");
}

// A compressed file read as uncompressed: the error says which compression its header shows.
TEST_F(TfRecordTest, CompressedFileReadAsUncompressedNamesTheSetting) {
  const std::string gz = path("data.tfrecord.gz");
  write_records(gz, sample_records(), Compression::Gzip);
  std::string msg = io_error_of([&] { read_tfrecord_file(gz, Compression::None); });
  EXPECT_CONTAINS(msg, gz + ": corrupt record at byte 0: length CRC mismatch");
  EXPECT_CONTAINS(msg,
                  "the file starts with gzip's magic bytes 1f 8b: it is compressed, read it "
                  "with compression GZIP");
  const std::string zl = path("data.tfrecord.zlib");
  write_records(zl, sample_records(), Compression::Zlib);
  msg = io_error_of([&] { read_tfrecord_file(zl, Compression::None); });
  EXPECT_CONTAINS(msg,
                  "the file starts with the zlib header 78 9c: it is compressed, read it "
                  "with compression ZLIB");
  // An uncompressed file with a bad length CRC gets no such hint.
  const std::string plain = path("plain.tfrecord");
  write_three(plain);
  std::string bytes = read_raw(plain);
  bytes[9] ^= 1;
  write_raw(plain, bytes);
  msg = io_error_of([&] { read_tfrecord_file(plain, Compression::None); });
  EXPECT_CONTAINS(msg, "length CRC mismatch");
  EXPECT_EQ(msg.find("compressed"), std::string::npos) << msg;
}

TEST_F(TfRecordTest, ConcatenatedGzipMembersReadAsOneStream) {
  write_records(path("a.gz"), {"one", "two"}, Compression::Gzip);
  write_records(path("b.gz"), {"three"}, Compression::Gzip);
  write_raw(path("ab.gz"), read_raw(path("a.gz")) + read_raw(path("b.gz")));
  EXPECT_EQ(read_tfrecord_file(path("ab.gz"), Compression::Gzip),
            (std::vector<std::string>{"one", "two", "three"}));
  write_raw(path("junk.gz"), read_raw(path("a.gz")) + "junk");
  EXPECT_CONTAINS(io_error_of([&] { read_tfrecord_file(path("junk.gz"), Compression::Gzip); }),
                  "unexpected bytes after the end of the gzip stream");
}

TEST_F(TfRecordTest, UnclosedWriterLeavesNoFile) {
  {
    TfRecordWriter writer(path("x.tfrecord"));
    writer.write("abc");
  }
  EXPECT_TRUE(listing().empty());

  std::vector<TfRecordWriter> writers;
  writers.emplace_back(path("moved.tfrecord"), Compression::Zlib);
  writers[0].write("a");
  TfRecordWriter moved = std::move(writers[0]);
  moved.write("b");
  moved.close();
  EXPECT_EQ(read_tfrecord_file(path("moved.tfrecord"), Compression::Zlib),
            (std::vector<std::string>{"a", "b"}));
}

TEST_F(TfRecordTest, WriterErrorsNameThePath) {
  const std::string p = path("missing/dir/x.tfrecord");
  const std::string msg = io_error_of([&] { TfRecordWriter w(p); });
  EXPECT_CONTAINS(msg, p);
  TfRecordWriter w(path("y.tfrecord"));
  w.close();
  w.close();  // idempotent
  EXPECT_CONTAINS(io_error_of([&] { w.write("z"); }), "closed");
  EXPECT_CONTAINS(io_error_of([&] { TfRecordReader r(path("nope")); }), path("nope"));
}

TEST_F(TfRecordTest, InputStreamPeekConsumeAndSmallBuffers) {
  std::string data;
  for (int i = 0; i < 20000; ++i) data += static_cast<char>('a' + i % 26);
  write_raw(path("s"), data);
  InputStream in(path("s"), Compression::None, 1);  // buffer rounded up to 4096
  std::string got;
  for (std::string_view v = in.peek(); !v.empty(); v = in.peek()) {
    got.append(v.substr(0, 1000));
    in.consume(std::min<std::size_t>(1000, v.size()));
  }
  EXPECT_EQ(got, data);
  EXPECT_EQ(in.position(), data.size());
  in.seek(5);
  char c[3];
  ASSERT_EQ(in.read(c, 3), 3u);
  EXPECT_EQ(std::string(c, 3), "fgh");
}

}  // namespace
}  // namespace hpm::io
