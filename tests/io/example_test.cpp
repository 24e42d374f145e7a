#include "hpm/io/example.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "hpm/io/atomic_file.h"
#include "hpm/io/tfrecord.h"
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

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

// Wraps a Feature message's bytes as Example{features{feature{key: <feature>}}}.
std::string wrap(const std::string& key, const std::string& feature) {
  auto ld = [](int field, const std::string& payload) {
    std::string out;
    out.push_back(static_cast<char>(field << 3 | 2));
    out.push_back(static_cast<char>(payload.size()));  // < 128 in these tests
    return out + payload;
  };
  return ld(1, ld(1, ld(1, key) + ld(2, feature)));
}

Example sample() {
  Example ex;
  ex["image"] = Feature::of_bytes({std::string("\x00\xff\x10", 3)});
  ex["label"] = Feature::of_ints({7});
  ex["scores"] = Feature::of_floats({0.5f, -1.25f, 1e30f});
  ex["ids"] = Feature::of_ints({-1, 0, std::numeric_limits<std::int64_t>::max(),
                                std::numeric_limits<std::int64_t>::min(), 300});
  ex["empty_ints"] = Feature::of_ints({});
  ex["empty_bytes"] = Feature::of_bytes({});
  ex["unset"] = Feature{};
  ex["words"] = Feature::of_bytes({"a", "", "longer word"});
  return ex;
}

TEST(ExampleTest, RoundTrip) {
  const Example ex = sample();
  const std::string enc = encode_example(ex);
  EXPECT_EQ(decode_example(enc, "rec"), ex);
  EXPECT_EQ(encode_example({}), "");
  EXPECT_TRUE(decode_example("", "rec").empty());
}

TEST(ExampleTest, KnownEncoding) {
  Example ex;
  ex["a"] = Feature::of_ints({1, 2});
  // Example.features{ feature{ key "a", value{ int64_list{ packed [1, 2] } } } }
  const std::string expect =
      bytes({0x0a, 0x0d, 0x0a, 0x0b, 0x0a, 0x01, 'a', 0x12, 0x06, 0x1a, 0x04, 0x0a, 0x02, 1, 2});
  EXPECT_EQ(encode_example(ex), expect);
  Example f;
  f["b"] = Feature::of_floats({1.0f});
  // float 1.0 = 0x3f800000, packed
  EXPECT_EQ(encode_example(f), bytes({0x0a, 0x0f, 0x0a, 0x0d, 0x0a, 0x01, 'b', 0x12, 0x08, 0x12,
                                      0x06, 0x0a, 0x04, 0x00, 0x00, 0x80, 0x3f}));
}

TEST(ExampleTest, DecodesUnpackedLists) {
  // int64_list{ value: 5 value: -1 } unpacked (wire type 0)
  std::string ints = bytes({0x08, 0x05, 0x08});
  for (int i = 0; i < 9; ++i) ints.push_back(static_cast<char>(0xff));
  ints.push_back(0x01);
  const std::string feature = bytes({0x1a, static_cast<int>(ints.size())}) + ints;
  const Example ex = decode_example(wrap("k", feature), "rec");
  EXPECT_EQ(ex.at("k"), Feature::of_ints({5, -1}));

  // float_list{ value: 2.0 value: -0.5 } unpacked (wire type 5), then a packed one merged in
  const std::string floats = bytes({0x0d, 0, 0, 0, 0x40, 0x0d, 0, 0, 0, 0xbf});
  const std::string packed = bytes({0x0a, 0x04, 0, 0, 0x80, 0x3f});
  const std::string f2 = bytes({0x12, static_cast<int>(floats.size())}) + floats +
                         bytes({0x12, static_cast<int>(packed.size())}) + packed;
  EXPECT_EQ(decode_example(wrap("f", f2), "rec").at("f"), Feature::of_floats({2.0f, -0.5f, 1.0f}));
}

TEST(ExampleTest, MergeRulesAndUnknownFields) {
  Example a;
  a["x"] = Feature::of_ints({1});
  a["y"] = Feature::of_ints({2});
  Example b;
  b["x"] = Feature::of_floats({3.0f});
  // Two concatenated Examples merge: the repeated key keeps the last entry.
  const Example m = decode_example(encode_example(a) + encode_example(b), "rec");
  EXPECT_EQ(m.at("x"), Feature::of_floats({3.0f}));
  EXPECT_EQ(m.at("y"), Feature::of_ints({2}));
  // Unknown fields of every wire type are skipped.
  const std::string unknown = bytes({0x38, 0x96, 0x01,                      // field 7 varint
                                     0x41, 1,    2,    3,   4, 5, 6, 7, 8,  // field 8 fixed64
                                     0x4a, 0x02, 'h',  'i',                 // field 9 bytes
                                     0x55, 1,    2,    3,   4});            // field 10 fixed32
  EXPECT_EQ(decode_example(unknown + encode_example(a) + unknown, "rec"), a);
}

TEST(ExampleTest, DecodeErrorsNameWhereAndOffset) {
  const std::string good = encode_example(sample());
  // Truncation anywhere is an error, never a crash.
  for (std::size_t n = 1; n < good.size(); ++n) {
    const std::string msg =
        io_error_of([&] { decode_example(good.substr(0, n), "file.tfrecord:3"); });
    EXPECT_CONTAINS(msg, "file.tfrecord:3");
    EXPECT_CONTAINS(msg, "at byte");
  }
  // Truncated varint.
  EXPECT_CONTAINS(io_error_of([] {
                    decode_example(bytes({0x38, 0x96}), "r");
                  }),
                  "r: invalid tf.train.Example at byte 1: truncated varint");
  // Length past the end.
  EXPECT_CONTAINS(io_error_of([] {
                    decode_example(bytes({0x0a, 0x05, 0x0a}), "r");
                  }),
                  "at byte 1: length 5 of Example.features runs past the end");
  // Wrong wire type for a known field.
  EXPECT_CONTAINS(io_error_of([] {
                    decode_example(bytes({0x08, 0x01}), "r");
                  }),
                  "at byte 0: Example.features: expected wire type 2 (length-delimited), found 0");
  // Wrong wire type inside a list: int64_list value as fixed32.
  EXPECT_CONTAINS(io_error_of([] {
                    decode_example(wrap("k", bytes({0x1a, 0x05, 0x0d, 1, 2, 3, 4})), "r");
                  }),
                  "Int64List.value: expected wire type 0 (varint), found 5");
  // Packed floats not a multiple of 4.
  EXPECT_CONTAINS(io_error_of([] {
                    decode_example(wrap("k", bytes({0x12, 0x05, 0x0a, 0x03, 1, 2, 3})), "r");
                  }),
                  "expected a multiple of 4");
  // Groups, invalid wire types, field 0, overlong varints.
  EXPECT_CONTAINS(io_error_of([] { decode_example(bytes({0x3b}), "r"); }), "start group");
  EXPECT_CONTAINS(io_error_of([] { decode_example(bytes({0x3e}), "r"); }), "invalid wire type 6");
  EXPECT_CONTAINS(io_error_of([] {
                    decode_example(bytes({0x02, 0x00}), "r");
                  }),
                  "invalid field number 0");
  std::string overlong(11, static_cast<char>(0x80));
  EXPECT_CONTAINS(io_error_of([&] { decode_example(bytes({0x38}) + overlong, "r"); }),
                  "longer than 10 bytes");
}

TEST(ExampleTest, MutatedBytesDecodeOrThrowIoError) {
  const std::string good = encode_example(sample());
  unsigned state = 7;
  const auto rnd = [&] {
    state = state * 1103515245u + 12345u;
    return state >> 8;
  };
  int errors = 0;
  for (int trial = 0; trial < 5000; ++trial) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rnd() % 3);
    for (int i = 0; i < flips; ++i) bad[rnd() % bad.size()] = static_cast<char>(rnd());
    try {
      decode_example(bad, "fuzz");
    } catch (const IoError& e) {
      ++errors;
      EXPECT_CONTAINS(e.what(), "fuzz: invalid tf.train.Example at byte");
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(ExampleTest, ReadsPythonFixtures) {
  const auto doc = nlohmann::json::parse(read_file(kFixtures + "examples.json"));
  const auto records = read_tfrecord_file(kFixtures + "examples.tfrecord.gz", Compression::Gzip);
  ASSERT_EQ(records.size(), doc["records"].size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& rec = doc["records"][i];
    const Example ex = decode_example(records[i], "record " + std::to_string(i));
    Example expect;
    for (const auto& [key, f] : rec["features"].items()) {
      const std::string kind = f["kind"];
      if (kind == "bytes_list") {
        std::vector<std::string> v;
        for (const auto& h : f["hex"]) v.push_back(from_hex(h.get<std::string>()));
        expect[key] = Feature::of_bytes(v);
      } else if (kind == "float_list") {
        std::vector<float> v;
        for (const auto& b : f["bits"]) v.push_back(std::bit_cast<float>(b.get<std::uint32_t>()));
        expect[key] = Feature::of_floats(v);
      } else {
        expect[key] = Feature::of_ints(f["values"].get<std::vector<std::int64_t>>());
      }
    }
    EXPECT_EQ(ex, expect) << "record " << i;
    if (rec["canonical"].get<bool>()) {
      EXPECT_EQ(encode_example(ex), records[i]) << "record " << i;
    }
  }
  // The spot checks the fixture was made for.
  const Example e1 = decode_example(records[1], "record 1");
  EXPECT_EQ(e1.at("label").ints, std::vector<std::int64_t>{-1});
  EXPECT_TRUE(e1.at("ids").ints.empty());
  const Example e2 = decode_example(records[2], "record 2");
  EXPECT_EQ(e2.at("ids").ints, (std::vector<std::int64_t>{-5, (std::int64_t{1} << 62) + 1}));
  EXPECT_EQ(e2.at("name").bytes, (std::vector<std::string>{"h\xc3\xa9llo", ""}));
}

TEST(ParseExampleTest, FixedLenFeatures) {
  const Example ex = sample();
  const auto out = parse_example(
      ex,
      {FixedLenFeature{"scores", Feature::Float, Shape{3}, {}},
       FixedLenFeature{"label", Feature::Int64, Shape{}, {}},
       FixedLenFeature{"image", Feature::Bytes, Shape{}, {}},
       FixedLenFeature{"missing", Feature::Float, Shape{2, 2}, Feature::of_floats({9.0f})},
       FixedLenFeature{"missing2", Feature::Int64, Shape{2}, Feature::of_ints({4, 5})}},
      "rec");
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(out[0].first, "scores");
  EXPECT_EQ(out[0].second.dtype(), DType::F32);
  EXPECT_EQ(out[0].second.shape(), Shape{3});
  EXPECT_EQ(out[0].second.to_vector(), (std::vector<float>{0.5f, -1.25f, 1e30f}));
  EXPECT_EQ(out[1].second.dtype(), DType::I64);
  EXPECT_EQ(out[1].second.shape(), Shape{});
  EXPECT_EQ(out[1].second.to_vector_i64(), std::vector<std::int64_t>{7});
  EXPECT_EQ(out[2].second.dtype(), DType::I8);
  EXPECT_EQ(out[2].second.shape(), Shape{3});
  EXPECT_EQ(std::string(static_cast<const char*>(out[2].second.raw_data()), 3),
            std::string("\x00\xff\x10", 3));
  EXPECT_EQ(out[3].second.to_vector(), std::vector<float>(4, 9.0f));
  EXPECT_EQ(out[4].second.to_vector_i64(), (std::vector<std::int64_t>{4, 5}));
}

TEST(ParseExampleTest, FixedLenErrors) {
  const Example ex = sample();
  auto err = [&](FeatureSpec spec) {
    return io_error_of([&] { parse_example(ex, {spec}, "data.tfrecord:5"); });
  };
  const std::string count = err(FixedLenFeature{"scores", Feature::Float, Shape{2, 2}, {}});
  EXPECT_CONTAINS(count, "data.tfrecord:5: feature 'scores'");
  EXPECT_CONTAINS(count, "expected 4 values for shape [2, 2], found 3");
  EXPECT_CONTAINS(err(FixedLenFeature{"nope", Feature::Float, Shape{}, {}}),
                  "feature 'nope' is required");
  EXPECT_CONTAINS(err(FixedLenFeature{"label", Feature::Float, Shape{}, {}}),
                  "feature 'label': expected float_list, found int64_list");
  EXPECT_CONTAINS(err(FixedLenFeature{"words", Feature::Bytes, Shape{3}, {}}),
                  "bytes features can be parsed only as a single value");
  EXPECT_CONTAINS(err(FixedLenFeature{"words", Feature::Bytes, Shape{}, {}}),
                  "expected 1 bytes value, found 3");
  EXPECT_CONTAINS(io_error_of([&] {
                    parse_example(ex,
                                  {VarLenFeature{"ids", Feature::Int64, {}, 0},
                                   VarLenFeature{"ids", Feature::Int64, {}, 0}},
                                  "r");
                  }),
                  "appears twice");
}

TEST(ParseExampleTest, VarLenRaggedAndPadded) {
  const Example ex = sample();
  const auto out = parse_example(ex,
                                 {VarLenFeature{"ids", Feature::Int64, {}, 0},
                                  VarLenFeature{"scores", Feature::Float, 5, -1.0},
                                  VarLenFeature{"empty_ints", Feature::Int64, 2, 9},
                                  VarLenFeature{"missing", Feature::Float, {}, 0},
                                  VarLenFeature{"unset", Feature::Float, {}, 0}},
                                 "rec");
  EXPECT_EQ(out[0].second.shape(), Shape{5});
  EXPECT_EQ(out[0].second.to_vector_i64(), ex.at("ids").ints);
  EXPECT_EQ(out[1].second.shape(), Shape{5});
  EXPECT_EQ(out[1].second.to_vector(), (std::vector<float>{0.5f, -1.25f, 1e30f, -1.0f, -1.0f}));
  EXPECT_EQ(out[2].second.to_vector_i64(), (std::vector<std::int64_t>{9, 9}));
  EXPECT_EQ(out[3].second.shape(), Shape{0});
  EXPECT_EQ(out[4].second.shape(), Shape{0});  // a Feature with no list set is empty

  EXPECT_CONTAINS(io_error_of([&] {
                    parse_example(ex, {VarLenFeature{"ids", Feature::Int64, 3, 0}}, "r");
                  }),
                  "feature 'ids': expected at most 3 values (pad_to), found 5");
  EXPECT_CONTAINS(io_error_of([&] {
                    parse_example(ex, {VarLenFeature{"words", Feature::Bytes, {}, 0}}, "r");
                  }),
                  "var-len features must be float_list or int64_list");
}

}  // namespace
}  // namespace hpm::io
