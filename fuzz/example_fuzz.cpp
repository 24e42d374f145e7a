// tf.train.Example protocol buffers: decoded, parsed with a spec of each kind for every feature
// found (fixed length, variable length padded), and re-encoded: decoding the re-encoding must give
// the same Example back.
#include <cstdlib>
#include <string>
#include <vector>

#include "hpm/io/example.h"

using namespace hpm;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  io::Example example;
  try {
    example = io::decode_example(std::string_view(reinterpret_cast<const char*>(data), size),
                                 "fuzz input");
  } catch (const std::exception&) {
    return 0;
  }
  if (io::decode_example(io::encode_example(example), "re-encoded") != example) std::abort();
  std::vector<io::FeatureSpec> specs;
  for (const auto& [key, feature] : example) {
    if (feature.kind == io::Feature::Bytes) {
      specs.emplace_back(io::FixedLenFeature{key, io::Feature::Bytes, Shape{}, std::nullopt});
    } else if (feature.kind != io::Feature::None) {
      specs.emplace_back(io::VarLenFeature{key, feature.kind, std::nullopt, 0.0});
      specs.emplace_back(io::VarLenFeature{key, feature.kind, 4, -1.0});
      specs.emplace_back(io::FixedLenFeature{key, feature.kind, Shape{2, 2}, std::nullopt});
    }
  }
  specs.emplace_back(
      io::FixedLenFeature{"absent", io::Feature::Float, Shape{3}, io::Feature::of_floats({1.5f})});
  try {
    io::parse_example(example, specs, "fuzz input");
  } catch (const std::exception&) {
  }
  return 0;
}
