#include "hpm/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "hpm/io/atomic_file.h"
#include "io_test_util.h"

namespace hpm::io {
namespace {

using testing::io_error_of;

// An 8-byte little-endian size followed by the header text as given (no padding) and the data.
std::string raw_file(const std::string& header, const std::string& data = "") {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  return out + header + data;
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

Tensor i32_tensor(std::initializer_list<std::int32_t> values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::I32);
  std::memcpy(t.raw_data(), values.begin(), values.size() * sizeof(std::int32_t));
  return t;
}

class Safetensors : public testing::TempDirTest {
 protected:
  // Writes `bytes` to a file, loads it, and returns the IoError message after checking that it
  // names the file and contains `phrase`.
  std::string load_error(const std::string& bytes, const std::string& phrase) {
    const std::string p = path("bad.safetensors");
    write_raw(p, bytes);
    const std::string msg = io_error_of([&] { load_safetensors(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, phrase);
    return msg;
  }
};

TEST_F(Safetensors, RoundTripsDtypesScalarsAndEmptyTensors) {
  const Tensor w = Tensor::from({1.5f, -2, 3, 4, 5, 6.25f}, {2, 3});
  const std::vector<std::int64_t> labels = {0, -1, 1LL << 40, 9};
  const Tensor b = Tensor::from_i64(labels, {4});
  const Tensor c = i32_tensor({7, -8, 2147483647}, {3});
  const Tensor s = Tensor::scalar(3.5f);
  const Tensor e = Tensor::zeros({0, 4});
  const Tensor e64 = Tensor::zeros({0}, DType::I64);
  Tensor h = Tensor::empty({2}, DType::BF16);
  std::memcpy(h.raw_data(), "\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  Tensor q = Tensor::empty({3}, DType::I8);
  std::memcpy(q.raw_data(), "\x01\xff\x7f", 3);
  const NamedTensors in = {{"w", w}, {"b", b},     {"c", c}, {"s", s},
                           {"e", e}, {"e64", e64}, {"h", h}, {"q", q}};
  const std::string p = path("model.safetensors");
  save_safetensors(p, in);

  const SafetensorsFile f = load_safetensors(p);
  EXPECT_EQ(f.path, p);
  EXPECT_TRUE(f.metadata.empty());
  ASSERT_EQ(f.tensors.size(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(in[i].first);
    EXPECT_EQ(f.tensors[i].first, in[i].first);  // file order is the given order here
    const Tensor& t = f.tensors[i].second;
    EXPECT_EQ(t.dtype(), in[i].second.dtype());
    EXPECT_EQ(t.shape(), in[i].second.shape());
    EXPECT_EQ(bytes_of(t), bytes_of(in[i].second));
    EXPECT_FALSE(t.same_storage(in[i].second));
  }
  EXPECT_EQ(f.at("w").to_vector(), w.to_vector());
  EXPECT_EQ(f.at("b").to_vector_i64(), labels);
  EXPECT_EQ(f.at("c").data<std::int32_t>()[2], 2147483647);
  EXPECT_EQ(f.at("s").dim(), 0);
  EXPECT_EQ(f.at("s").item(), 3.5f);
  EXPECT_EQ(f.at("e").shape(), Shape({0, 4}));
  EXPECT_TRUE(f.contains("e64"));
  EXPECT_FALSE(f.contains("nope"));
}

TEST_F(Safetensors, RoundTripsMetadataAndViews) {
  const Tensor m = Tensor::from({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor rows = m.narrow(1, 2);  // a view with a non-zero element offset
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"step", "1200"}, {"note", "ünïcode \"quoted\""}};
  const std::string p = path("ckpt.safetensors");
  save_safetensors(p, {{"rows", rows}}, meta);
  const SafetensorsFile f = load_safetensors(p);
  EXPECT_EQ(f.metadata, meta);
  EXPECT_EQ(f.at("rows").to_vector(), std::vector<float>({3, 4, 5, 6}));
}

// The metadata alone, from the header (hpm evaluate --weights reads an exported file's config so),
// with the header's errors as a whole load makes them.
TEST_F(Safetensors, MetadataReadsFromTheHeaderAlone) {
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"hpm_config", "[model]\n"}};
  const std::string p = path("w.safetensors");
  save_safetensors(p, {{"w", Tensor::ones({4, 4})}}, meta);
  EXPECT_EQ(read_safetensors_metadata(p), meta);
  save_safetensors(p, {{"w", Tensor::ones({2})}});
  EXPECT_TRUE(read_safetensors_metadata(p).empty());
  // A header claiming more bytes than the file has, a file too short for its size, bad JSON.
  for (const auto& [bytes, phrase] : std::vector<std::pair<std::string, std::string>>{
           {std::string("\x40\0\0\0\0\0\0\0{}", 10), "is larger than the file"},
           {std::string("\x02\0\0", 3), "file is too short"},
           {std::string("\x02\0\0\0\0\0\0\0{x", 10), "header is not valid JSON"}}) {
    write_raw(p, bytes);
    const std::string msg = io_error_of([&] { read_safetensors_metadata(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, phrase);
    EXPECT_EQ(msg, io_error_of([&] { load_safetensors(p); }));
  }
}

TEST_F(Safetensors, SaveOverwritesAtomically) {
  const std::string p = path("m.safetensors");
  save_safetensors(p, {{"a", Tensor::scalar(1)}});
  save_safetensors(p, {{"a", Tensor::scalar(2)}});
  EXPECT_EQ(load_safetensors(p).at("a").item(), 2.0f);
  EXPECT_EQ(listing(), std::vector<std::string>({"m.safetensors"}));
}

// Byte-exact layout, computed by hand. The header is
//   {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}
// = 5 + 15 + 12 + 20 + 2 = 54 bytes, padded with 2 spaces to 56 = 0x38.
TEST(SafetensorsEncode, ByteExactTinyFile) {
  const std::string got = encode_safetensors({{"a", Tensor::from({1.0f, 2.0f}, {2})}});
  const std::string want = std::string("\x38\0\0\0\0\0\0\0", 8) +
                           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  " +
                           std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  EXPECT_EQ(got.size(), 72u);
  EXPECT_EQ(got, want);
}

// With metadata (listed first, as the reference writer does), a 0-d tensor and an empty one:
// the 139-byte header is padded with 5 spaces to 144 = 0x90.
TEST(SafetensorsEncode, ByteExactWithMetadataScalarAndEmpty) {
  const std::vector<std::int64_t> x = {0x0102030405060708LL};
  const std::string got =
      encode_safetensors({{"x", Tensor::from_i64(x, {})}, {"e", Tensor::zeros({0, 3}, DType::I32)}},
                         {{"format", "pt"}});
  const std::string want =
      std::string("\x90\0\0\0\0\0\0\0", 8) +
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"x\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"e\":{\"dtype\":\"I32\",\"shape\":[0,3],\"data_offsets\":[8,8]}}     " +
      std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8);
  EXPECT_EQ(got, want);
  const SafetensorsFile f = decode_safetensors(got, "mem");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "x");
  EXPECT_EQ(f.tensors[1].first, "e");
}

TEST(SafetensorsEncode, EmptyFileHasEmptyHeader) {
  const std::string got = encode_safetensors({});
  EXPECT_EQ(got, std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  EXPECT_TRUE(decode_safetensors(got, "mem").tensors.empty());
}

TEST_F(Safetensors, EncodeRejectsDuplicateNames) {
  const std::string p = path("dup.safetensors");
  const std::string msg = io_error_of([&] {
    save_safetensors(p, {{"a", Tensor::scalar(1)}, {"a", Tensor::scalar(2)}});
  });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "duplicate tensor name 'a'");
  EXPECT_TRUE(listing().empty());
}

TEST(SafetensorsEncode, RejectsUndefinedAndReservedNames) {
  EXPECT_CONTAINS(io_error_of([] {
                    encode_safetensors({{"u", Tensor()}});
                  }),
                  "tensor 'u' is undefined");
  EXPECT_CONTAINS(io_error_of([] {
                    encode_safetensors({{"__metadata__", Tensor::scalar(1)}});
                  }),
                  "cannot be named '__metadata__'");
}

TEST_F(Safetensors, AtNamesMissingTensorAndPath) {
  const std::string p = path("m.safetensors");
  save_safetensors(p, {{"a", Tensor::scalar(1)}});
  const SafetensorsFile f = load_safetensors(p);
  EXPECT_CONTAINS(io_error_of([&] { f.at("zz"); }), "no tensor 'zz' in " + p);
}

TEST_F(Safetensors, MissingFile) {
  const std::string p = path("absent.safetensors");
  EXPECT_CONTAINS(io_error_of([&] { load_safetensors(p); }), "cannot open " + p);
}

// -- decode errors: one per message -------------------------------------------------------------

const std::string kA = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
const std::string kEight(8, '\x11');

TEST_F(Safetensors, ErrorFileTooShort) { load_error("abc", "too short"); }

TEST_F(Safetensors, ErrorHeaderSizeOverLimit) {
  std::string bytes = raw_file("{}");
  bytes[0] = 0;
  bytes[4] = 1;  // 2^32
  load_error(bytes, "exceeds the 100000000-byte limit");
}

TEST_F(Safetensors, ErrorHeaderLargerThanFile) {
  std::string bytes = raw_file("{}");
  bytes[0] = 100;
  load_error(bytes, "header size 100 (u64 at offset 0) is larger than the file: only 2 bytes");
}

TEST_F(Safetensors, ErrorHeaderNotJson) {
  load_error(raw_file("{\"a\": nope}"),
             "header is not valid JSON (error at header byte 7, file offset 15)");
}

TEST_F(Safetensors, ErrorHeaderNotObject) {
  load_error(raw_file("[1, 2]"), "header is not a JSON object (found array)");
}

TEST_F(Safetensors, ErrorHeaderNotStartingWithBrace) {
  load_error(raw_file(" {}"), "does not start with '{'");
}

TEST_F(Safetensors, ErrorDuplicateTensorName) {
  load_error(raw_file("{" + kA + "," + kA + "}", kEight), "duplicate tensor name 'a'");
}

TEST_F(Safetensors, ErrorDuplicateKeyInEntry) {
  load_error(
      raw_file(R"({"a":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}})", kEight),
      "tensor 'a': duplicate key 'dtype' in its header entry");
}

TEST_F(Safetensors, ErrorDuplicateMetadataKey) {
  load_error(raw_file(R"({"__metadata__":{"k":"1","k":"2"}})"),
             "duplicate key 'k' in __metadata__");
}

TEST_F(Safetensors, ErrorMetadataNotObject) {
  load_error(raw_file(R"({"__metadata__":["x"]})"), "__metadata__ must be an object");
}

TEST_F(Safetensors, ErrorMetadataValueNotString) {
  load_error(raw_file(R"({"__metadata__":{"step":12}})"),
             "__metadata__ value of key 'step' must be a string, found integer 12");
}

TEST_F(Safetensors, ErrorEntryNotObject) {
  load_error(raw_file(R"({"a":[1]})"), "tensor 'a': entry is not an object (found array)");
}

TEST_F(Safetensors, ErrorMissingField) {
  load_error(raw_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", kEight),
             "tensor 'a': missing field 'dtype'");
  load_error(raw_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", kEight),
             "tensor 'a': missing field 'shape'");
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", kEight),
             "tensor 'a': missing field 'data_offsets'");
}

TEST_F(Safetensors, ErrorDtypeNotString) {
  load_error(raw_file(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", kEight),
             "tensor 'a': field 'dtype' must be a string, found integer 4");
}

TEST_F(Safetensors, ErrorUnknownDtype) {
  // F16 is read now (weights cast on load); float8 and unsigned types are not.
  load_error(raw_file(R"({"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", kEight),
             "tensor 'a': unsupported dtype 'F8_E4M3'");
}

TEST_F(Safetensors, ErrorShapeIllTyped) {
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", kEight),
             "tensor 'a': field 'shape' must be an array of integers, found string");
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", kEight),
             "tensor 'a': field 'shape' must be an array of integers, found [2.0]");
}

TEST_F(Safetensors, ErrorNegativeDimension) {
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[-2,-1],"data_offsets":[0,8]}})", kEight),
             "tensor 'a': negative dimension -2 in shape [-2,-1]");
}

TEST_F(Safetensors, ErrorShapeTooLarge) {
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                      R"("data_offsets":[0,8]}})",
                      kEight),
             "tensor 'a': shape [4294967296,4294967296] is too large");
}

TEST_F(Safetensors, ErrorOffsetsIllTyped) {
  const std::string phrase =
      "tensor 'a': field 'data_offsets' must be an array of two non-negative integers";
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", kEight), phrase);
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", kEight),
             phrase);
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":"0-8"}})", kEight), phrase);
}

TEST_F(Safetensors, ErrorOffsetsReversed) {
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", kEight),
             "tensor 'a': data_offsets [8,0] end before they begin");
}

TEST_F(Safetensors, ErrorOffsetsDoNotMatchDtypeAndShape) {
  load_error(raw_file(R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,8]}})", kEight),
             "tensor 'a': data_offsets [0,8] span 8 bytes but dtype I64 and shape [2] need 16 "
             "bytes");
}

TEST_F(Safetensors, ErrorOffsetsPastDataSection) {
  load_error(raw_file("{" + kA + "}", "1234"),
             "tensor 'a': data_offsets [0, 8] (file offsets 62 to 70) extend past the end of the "
             "data section, which has 4 bytes");
}

TEST_F(Safetensors, ErrorOverlappingTensors) {
  const std::string msg =
      load_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          std::string(12, 'x')),
                 "tensor 'b': data_offsets [4, 12] (file offsets 120 to 128)");
  EXPECT_CONTAINS(msg, "overlap tensor 'a' data_offsets [0, 8]");
}

TEST_F(Safetensors, ErrorGapBetweenTensors) {
  const std::string msg =
      load_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          std::string(12, 'x')),
                 "tensor 'b': data_offsets [8, 12] (file offsets 124 to 128)");
  EXPECT_CONTAINS(msg,
                  "leave a gap: data section bytes [4, 8) belong to no tensor (after tensor 'a')");
}

TEST_F(Safetensors, ErrorGapAtStart) {
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", kEight),
             "tensor 'a': data_offsets [4, 8] (file offsets 66 to 70) leave a gap: data section "
             "bytes [0, 4) belong to no tensor");
}

TEST_F(Safetensors, ErrorTrailingBytesAfterLastTensor) {
  load_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", kEight),
             "data section bytes [4, 8) (file offsets 66 to 70) belong to no tensor: trailing "
             "bytes after the last tensor 'a'");
  load_error(raw_file("{}", "xy"), "trailing bytes (the file has no tensors)");
}

// Decoding must not trust the header: files are sorted by offset whatever the JSON key order.
TEST(SafetensorsDecode, SortsByDataOffset) {
  const std::string bytes = raw_file(R"({"b":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},)"
                                     R"("a":{"dtype":"I8","shape":[2],"data_offsets":[1,3]}}  )",
                                     "\x05\x06\x07");
  const SafetensorsFile f = decode_safetensors(bytes, "mem");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "b");
  EXPECT_EQ(f.tensors[1].first, "a");
  EXPECT_EQ(bytes_of(f.at("a")), "\x06\x07");
}

}  // namespace
}  // namespace hpm::io
