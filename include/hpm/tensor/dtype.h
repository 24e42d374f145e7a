// Element types. Kernels compute in float32 (bf16 operands for the mixed-precision products);
// int64 holds labels and indices; F16 and F64 exist so that weight files in those types can be
// read (and cast to f32) and written; U8 carries bytes (control messages between ranks).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace hpm {

enum class DType : std::uint8_t { F32, I64, I32, BF16, I8, F16, F64, U8 };

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
    case DType::F16:
      return 2;
    case DType::F64:
      return 8;
    case DType::U8:
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
// IEEE 754 half precision, as its bits (a type of its own, so it is not taken for bf16).
struct Float16Bits {
  std::uint16_t bits;
};
template <>
struct dtype_of<Float16Bits> {
  static constexpr DType value = DType::F16;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<std::uint8_t> {
  static constexpr DType value = DType::U8;
};

}  // namespace hpm
