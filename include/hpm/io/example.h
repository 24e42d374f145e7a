// tf.train.Example: the record payload of TensorFlow's input pipelines, encoded and decoded in the
// protobuf wire format by hand (no protobuf library), plus tf.io.parse_example-style conversion to
// tensors.
//
// Messages (tensorflow/core/example/example.proto, feature.proto):
//   Example   { Features features = 1; }
//   Features  { map<string, Feature> feature = 1; }   // entries: key = 1, value = 2
//   Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                            Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }
//   FloatList { repeated float value = 1 [packed = true]; }
//   Int64List { repeated int64 value = 1 [packed = true]; }
//
// The encoder writes packed lists and keys in sorted order (what TensorFlow's deterministic
// serialization produces). The decoder accepts packed and unpacked lists, map entries in any
// order, and follows protobuf's merge rules: a repeated key keeps the last entry, a repeated
// Example.features merges, a Feature whose oneof appears twice with the same kind appends the
// values and with another kind keeps the last. Unknown fields with a valid wire type are skipped.
// Everything else (truncated varints, lengths past the end, a wrong wire type for a known field,
// groups, field number 0) is an IoError naming `where` and the byte offset within the record.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "hpm/io/error.h"
#include "hpm/tensor/tensor.h"

namespace hpm::io {

struct Feature {
  // None: no list set (an empty Feature message); parse_example treats it as an empty list of
  // whatever kind the spec asks for, as TensorFlow does.
  enum Kind { None, Bytes, Float, Int64 };
  Kind kind = None;
  std::vector<std::string> bytes;
  std::vector<float> floats;
  std::vector<std::int64_t> ints;

  static Feature of_bytes(std::vector<std::string> v) {
    Feature f;
    f.kind = Bytes;
    f.bytes = std::move(v);
    return f;
  }
  static Feature of_floats(std::vector<float> v) {
    Feature f;
    f.kind = Float;
    f.floats = std::move(v);
    return f;
  }
  static Feature of_ints(std::vector<std::int64_t> v) {
    Feature f;
    f.kind = Int64;
    f.ints = std::move(v);
    return f;
  }
  // Number of values of the set kind (0 for None).
  std::size_t size() const;
  // Compares kind and the values of that kind (floats bitwise, so NaNs compare equal).
  bool operator==(const Feature& o) const;
};

// "bytes_list", "float_list", "int64_list" or "none".
const char* feature_kind_name(Feature::Kind k);

using Example = std::map<std::string, Feature>;

std::string encode_example(const Example& example);
Example decode_example(std::string_view bytes, const std::string& where_for_errors);

// -- parse_example ----------------------------------------------------------------------------
//
// Each spec yields one named tensor, in spec order:
//  - FixedLenFeature of kind Float -> F32 tensor of `shape`; Int64 -> I64 tensor of `shape`. The
//    example must hold exactly shape.numel() values (IoError naming the key and both counts). A
//    missing key uses `default_value` (shape.numel() values, or one value repeated), else IoError.
//  - FixedLenFeature of kind Bytes: only a single value (shape [] or [1]) is supported, returned
//    as an I8 tensor of shape [n] holding its raw bytes (an encoded image, a string); hpm has no
//    string or u8 dtype. Bytes lists of other shapes are an IoError: read Example[key].bytes.
//  - VarLenFeature of kind Float/Int64: a 1-D tensor of the values present (ragged: its length
//    varies per example; a missing key gives shape [0]); with `pad_to`, a tensor of shape
//    [pad_to] filled up with `pad_value` (IoError if the example holds more than pad_to values).
//    Kind Bytes is not supported.
// A feature whose kind differs from the spec's is an IoError naming the key and both kinds.
struct FixedLenFeature {
  std::string key;
  Feature::Kind kind = Feature::Float;
  Shape shape;
  std::optional<Feature> default_value;
};

struct VarLenFeature {
  std::string key;
  Feature::Kind kind = Feature::Int64;
  std::optional<std::int64_t> pad_to;
  double pad_value = 0.0;
};

using FeatureSpec = std::variant<FixedLenFeature, VarLenFeature>;

std::vector<std::pair<std::string, Tensor>> parse_example(const Example& example,
                                                          const std::vector<FeatureSpec>& specs,
                                                          const std::string& where_for_errors);

}  // namespace hpm::io
