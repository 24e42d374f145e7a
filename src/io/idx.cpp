#include "hpm/io/idx.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>

#include "hpm/io/atomic_file.h"

namespace hpm::io {
namespace {

// zlib counts in uInt; feed larger buffers in pieces of this size.
constexpr std::size_t kZChunk = std::size_t{1} << 30;

const char* type_name(std::uint8_t type) {
  switch (type) {
    case kIdxU8:
      return "u8";
    case kIdxI8:
      return "i8";
    case kIdxI16:
      return "i16";
    case kIdxI32:
      return "i32";
    case kIdxF32:
      return "f32";
    case kIdxF64:
      return "f64";
  }
  return "unknown";
}

std::string hex_byte(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", v & 0xFFu);
  return buf;
}

bool is_gzip(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// Decompresses all gzip members of `in`. Truncation, corruption (including a CRC or length
// mismatch in a member's trailer) and trailing non-gzip bytes are errors.
std::string gunzip(const std::string& path, const std::string& in) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK) {
    throw IoError(path + ": cannot initialise zlib inflate");
  }
  struct Guard {
    z_stream* zs;
    ~Guard() { inflateEnd(zs); }
  } guard{&zs};

  std::string out(std::max<std::size_t>(in.size() * 4, 1 << 16), '\0');
  std::size_t in_pos = 0;   // input handed to zlib before the current piece
  std::size_t out_pos = 0;  // output produced before the current piece
  const auto consumed = [&] { return in_pos - zs.avail_in; };
  zs.avail_in = 0;
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      const std::size_t piece = std::min(kZChunk, in.size() - in_pos);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + in_pos));
      zs.avail_in = static_cast<uInt>(piece);
      in_pos += piece;
    }
    if (out_pos == out.size()) out.resize(out.size() * 2);
    const std::size_t space = std::min(kZChunk, out.size() - out_pos);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + out_pos);
    zs.avail_out = static_cast<uInt>(space);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out_pos += space - zs.avail_out;
    if (rc == Z_STREAM_END) {
      const std::size_t at = consumed();
      if (at == in.size()) break;
      // Another gzip member may follow (concatenated .gz files are valid gzip).
      const bool member = in.size() - at >= 2 && static_cast<unsigned char>(in[at]) == 0x1f &&
                          static_cast<unsigned char>(in[at + 1]) == 0x8b;
      if (!member) {
        throw IoError(path + ": " + std::to_string(in.size() - at) +
                      " trailing bytes after the gzip data at compressed offset " +
                      std::to_string(at) + " (expected end of file or another gzip member)");
      }
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_out == 0) continue;  // needs more output space
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_pos == in.size()) {
      throw IoError(path +
                    ": gzip data is truncated or corrupt: the compressed stream ends at byte " +
                    std::to_string(in.size()) + " before the end of the gzip member (" +
                    std::to_string(out_pos) + " bytes decompressed so far)");
    }
    throw IoError(path + ": gzip data is corrupt at compressed offset " +
                  std::to_string(consumed()) + ": " +
                  (zs.msg ? zs.msg : "zlib error " + std::to_string(rc)));
  }
  out.resize(out_pos);
  return out;
}

std::string gzip_compress(const std::string& path, std::string_view in) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK) {
    throw IoError(path + ": cannot initialise zlib deflate");
  }
  struct Guard {
    z_stream* zs;
    ~Guard() { deflateEnd(zs); }
  } guard{&zs};
  std::string out(std::max<std::size_t>(in.size() / 2, 1 << 12), '\0');
  std::size_t in_pos = 0;
  std::size_t out_pos = 0;
  zs.avail_in = 0;
  for (;;) {
    if (zs.avail_in == 0 && in_pos < in.size()) {
      const std::size_t piece = std::min(kZChunk, in.size() - in_pos);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + in_pos));
      zs.avail_in = static_cast<uInt>(piece);
      in_pos += piece;
    }
    if (out_pos == out.size()) out.resize(out.size() * 2);
    const std::size_t space = std::min(kZChunk, out.size() - out_pos);
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + out_pos);
    zs.avail_out = static_cast<uInt>(space);
    const int flush = (in_pos == in.size() && zs.avail_in == 0) ? Z_FINISH : Z_NO_FLUSH;
    const int rc = deflate(&zs, flush);
    out_pos += space - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK && rc != Z_BUF_ERROR) {
      throw IoError(path + ": gzip compression failed: zlib error " + std::to_string(rc));
    }
  }
  out.resize(out_pos);
  return out;
}

void swap_bytes(unsigned char* p, std::size_t n, std::size_t elem) {
  if (elem == 1 || std::endian::native == std::endian::big) return;
  for (std::size_t i = 0; i + elem <= n; i += elem) std::reverse(p + i, p + i + elem);
}

std::uint64_t element_count(const std::vector<std::int64_t>& dims) {
  std::uint64_t n = 1;
  for (auto d : dims) n *= static_cast<std::uint64_t>(d);
  return n;
}

void check_array(const IdxArray& a, const char* what) {
  const std::size_t es = idx_elem_size(a.type);
  if (es == 0) throw IoError(std::string(what) + ": unknown IDX type " + hex_byte(a.type));
  for (auto d : a.dims) {
    if (d < 0 || d > 0xFFFFFFFFLL) {
      throw IoError(std::string(what) + ": dimension " + std::to_string(d) + " in " +
                    Shape(a.dims).str() + " is not a u32");
    }
  }
  const std::uint64_t need = element_count(a.dims) * es;
  if (a.data.size() != need) {
    throw IoError(std::string(what) + ": data has " + std::to_string(a.data.size()) +
                  " bytes but dims " + Shape(a.dims).str() + " of type " + type_name(a.type) +
                  " need " + std::to_string(need));
  }
}

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::size_t idx_elem_size(std::uint8_t type) {
  switch (type) {
    case kIdxU8:
    case kIdxI8:
      return 1;
    case kIdxI16:
      return 2;
    case kIdxI32:
    case kIdxF32:
      return 4;
    case kIdxF64:
      return 8;
  }
  return 0;
}

IdxArray read_idx(const std::string& path) {
  const std::string raw = read_file(path);
  const bool gz = is_gzip(raw);
  const std::string bytes = gz ? gunzip(path, raw) : raw;
  // Offsets in messages are into the decompressed stream for gzip files.
  const std::string where = gz ? path + " (decompressed)" : path;
  const auto fail = [&](const std::string& msg) { throw IoError(where + ": " + msg); };
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(bytes[i]); };

  if (bytes.size() < 4) {
    fail("too short for an IDX header: expected at least 4 bytes, found " +
         std::to_string(bytes.size()));
  }
  if (byte(0) != 0 || byte(1) != 0) {
    char found[8];
    std::snprintf(found, sizeof found, "0x%02X%02X", byte(0), byte(1));
    fail(std::string("bad IDX magic at offset 0: expected 0x0000, found ") + found);
  }
  IdxArray a;
  a.type = byte(2);
  const std::size_t es = idx_elem_size(a.type);
  if (es == 0) {
    fail("unknown IDX type byte " + hex_byte(a.type) +
         " at offset 2: expected 0x08, 0x09, 0x0B, 0x0C, 0x0D or 0x0E");
  }
  const std::size_t rank = byte(3);
  if (rank == 0) fail("IDX dimension count at offset 3 is 0: expected at least 1");
  const std::size_t header = 4 + 4 * rank;
  if (bytes.size() < header) {
    fail("truncated header: expected " + std::to_string(rank) + " dimensions (" +
         std::to_string(4 * rank) + " bytes) at offset 4, found " +
         std::to_string(bytes.size() - 4) + " bytes");
  }
  // The product of the nonzero dimensions must fit too, not only the byte count: with a zero
  // dimension the array is empty, but a shape's element count over the other dimensions (found by
  // fuzz/idx_fuzz.cpp) would overflow.
  std::uint64_t need = es, nonzero = es;
  for (std::size_t i = 0; i < rank; ++i) {
    const std::size_t o = 4 + 4 * i;
    const std::uint32_t d = static_cast<std::uint32_t>(byte(o)) << 24 |
                            static_cast<std::uint32_t>(byte(o + 1)) << 16 |
                            static_cast<std::uint32_t>(byte(o + 2)) << 8 | byte(o + 3);
    a.dims.push_back(d);
    if (d != 0 &&
        nonzero > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / d) {
      fail("dimensions " + Shape(a.dims).str() + " are too large");
    }
    if (d != 0) nonzero *= d;
    need *= d;
  }
  const std::size_t found = bytes.size() - header;
  if (found < need) {
    fail("truncated: expected " + std::to_string(need) + " bytes of data (dims " +
         Shape(a.dims).str() + " of " + type_name(a.type) + ") at offset " +
         std::to_string(header) + ", found " + std::to_string(found));
  }
  if (found > need) {
    fail(std::to_string(found - need) + " trailing bytes at offset " +
         std::to_string(header + need) + " after the data: expected " + std::to_string(need) +
         " bytes of data (dims " + Shape(a.dims).str() + " of " + type_name(a.type) + "), found " +
         std::to_string(found));
  }
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  swap_bytes(a.data.data(), a.data.size(), es);
  return a;
}

Tensor idx_to_f32(const IdxArray& a, float scale) {
  check_array(a, "idx_to_f32");
  Tensor t = Tensor::empty(Shape(a.dims), DType::F32);
  float* out = t.data<float>();
  const unsigned char* p = a.data.data();
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    float v = 0;
    switch (a.type) {
      case kIdxU8:
        v = static_cast<float>(p[i]);
        break;
      case kIdxI8:
        v = static_cast<float>(static_cast<std::int8_t>(p[i]));
        break;
      case kIdxI16:
        v = static_cast<float>(load<std::int16_t>(p + 2 * i));
        break;
      case kIdxI32:
        v = static_cast<float>(load<std::int32_t>(p + 4 * i));
        break;
      case kIdxF32:
        v = load<float>(p + 4 * i);
        break;
      case kIdxF64:
        v = static_cast<float>(load<double>(p + 8 * i));
        break;
    }
    out[i] = v * scale;
  }
  return t;
}

Tensor idx_to_i64(const IdxArray& a) {
  check_array(a, "idx_to_i64");
  if (a.type == kIdxF32 || a.type == kIdxF64) {
    throw IoError(std::string("idx_to_i64: IDX type ") + hex_byte(a.type) + " (" +
                  type_name(a.type) + ") is not an integer type");
  }
  Tensor t = Tensor::empty(Shape(a.dims), DType::I64);
  std::int64_t* out = t.data<std::int64_t>();
  const unsigned char* p = a.data.data();
  const std::size_t n = static_cast<std::size_t>(t.numel());
  for (std::size_t i = 0; i < n; ++i) {
    switch (a.type) {
      case kIdxU8:
        out[i] = p[i];
        break;
      case kIdxI8:
        out[i] = static_cast<std::int8_t>(p[i]);
        break;
      case kIdxI16:
        out[i] = load<std::int16_t>(p + 2 * i);
        break;
      case kIdxI32:
        out[i] = load<std::int32_t>(p + 4 * i);
        break;
    }
  }
  return t;
}

void write_idx(const std::string& path, const IdxArray& a, bool gzip) {
  check_array(a, ("write_idx " + path).c_str());
  if (a.dims.empty() || a.dims.size() > 255) {
    throw IoError("write_idx " + path + ": IDX needs 1 to 255 dimensions, got " +
                  std::to_string(a.dims.size()));
  }
  std::string bytes;
  bytes.reserve(4 + 4 * a.dims.size() + a.data.size());
  bytes.push_back('\0');
  bytes.push_back('\0');
  bytes.push_back(static_cast<char>(a.type));
  bytes.push_back(static_cast<char>(a.dims.size()));
  for (auto d : a.dims) {
    const auto u = static_cast<std::uint32_t>(d);
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<char>((u >> s) & 0xFFu));
  }
  const std::size_t header = bytes.size();
  bytes.append(reinterpret_cast<const char*>(a.data.data()), a.data.size());
  swap_bytes(reinterpret_cast<unsigned char*>(bytes.data() + header), a.data.size(),
             idx_elem_size(a.type));
  write_file_atomic(path, gzip ? gzip_compress(path, bytes) : bytes);
}

}  // namespace hpm::io
