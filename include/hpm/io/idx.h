// The IDX format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
//
//   2 bytes   0x00 0x00 (magic)
//   1 byte    element type: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64
//   1 byte    number of dimensions (at least 1)
//   4 * rank  dimensions, big-endian u32
//   rest      the elements, big-endian, row-major; exactly product(dims) of them
//
// Files may be raw or gzip-compressed (as distributed); gzip is detected by its magic 1f 8b. A
// truncated or corrupt file is an IoError naming the file, never a silent short read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hpm/io/error.h"
#include "hpm/tensor/tensor.h"

namespace hpm::io {

// IDX element type bytes.
inline constexpr std::uint8_t kIdxU8 = 0x08;
inline constexpr std::uint8_t kIdxI8 = 0x09;
inline constexpr std::uint8_t kIdxI16 = 0x0B;
inline constexpr std::uint8_t kIdxI32 = 0x0C;
inline constexpr std::uint8_t kIdxF32 = 0x0D;
inline constexpr std::uint8_t kIdxF64 = 0x0E;

struct IdxArray {
  std::uint8_t type = kIdxU8;
  std::vector<std::int64_t> dims;
  std::vector<unsigned char> data;  // native-endian elements, row-major
};

// Size in bytes of one element of an IDX type, 0 if the type byte is unknown.
std::size_t idx_elem_size(std::uint8_t type);

IdxArray read_idx(const std::string& path);

// An F32 tensor with a's dims holding each element times `scale` (e.g. 1/255 for pixels).
Tensor idx_to_f32(const IdxArray& a, float scale = 1.0f);
// An I64 tensor with a's dims; IoError unless a has an integer type (labels).
Tensor idx_to_i64(const IdxArray& a);

// Writes a (big-endian on disk), gzip-compressed if `gzip`, with write_file_atomic.
void write_idx(const std::string& path, const IdxArray& a, bool gzip);

}  // namespace hpm::io
