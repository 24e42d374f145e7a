#include "hpm/io/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace hpm::io {
namespace {

TEST(Crc32c, CheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(s, 0), 0u);
}

// The test vectors of RFC 3720 (iSCSI), appendix B.4: exercise the 8-byte loop.
TEST(Crc32c, Rfc3720Vectors) {
  std::vector<unsigned char> buf(32, 0);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x8A9136AAu);
  std::fill(buf.begin(), buf.end(), 0xFF);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) buf[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i)
    buf[static_cast<std::size_t>(i)] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(buf.data(), buf.size()), 0x113FDB5Cu);
}

// Slice-by-8 must agree with the bitwise definition for every length and misalignment.
TEST(Crc32c, MatchesBitwiseReferenceAndExtends) {
  const auto reference = [](const unsigned char* p, std::size_t n) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  std::vector<unsigned char> buf(100);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 37 + 11);
  for (std::size_t start = 0; start < 8; ++start) {
    for (std::size_t n = 0; start + n <= buf.size(); ++n) {
      const std::uint32_t want = reference(buf.data() + start, n);
      ASSERT_EQ(crc32c(buf.data() + start, n), want) << start << " " << n;
      const std::size_t half = n / 3;
      ASSERT_EQ(crc32c(buf.data() + start + half, n - half, crc32c(buf.data() + start, half)),
                want);
    }
  }
}

TEST(Crc32c, MaskedAsTfRecord) {
  const char* s = "123456789";
  // rotr(0xE3069283, 15) = 0x2507C60D; 0x2507C60D + 0xA282EAD8 = 0xC78AB0E5.
  EXPECT_EQ(masked_crc32c(s, 9), 0xC78AB0E5u);
  EXPECT_EQ(mask_crc32c(0xE3069283u), 0xC78AB0E5u);
  EXPECT_EQ(unmask_crc32c(masked_crc32c(s, 9)), 0xE3069283u);
  EXPECT_EQ(mask_crc32c(0), 0xa282ead8u);
}

}  // namespace
}  // namespace hpm::io
