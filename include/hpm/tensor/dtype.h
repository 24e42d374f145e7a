// Element types. float32 is the only type kernels compute in today; the enum and the size table are
// where bf16 and int8 slot in later. int64 holds labels and indices.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace hpm {

enum class DType : std::uint8_t { F32, I64, I32, BF16, I8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::I64:
      return 8;
    case DType::I32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::I8:
      return 1;
  }
  return 0;
}

// Names as the safetensors format spells them.
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // throws std::invalid_argument

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<std::int8_t> {
  static constexpr DType value = DType::I8;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr DType value = DType::I32;
};
// bfloat16 values are handled as their bits: the upper half of the float they round from.
template <>
struct dtype_of<std::uint16_t> {
  static constexpr DType value = DType::BF16;
};

}  // namespace hpm
