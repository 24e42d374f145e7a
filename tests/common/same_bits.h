// Whether two tensors hold the same bits: the assertion of every "bit for bit" test (a fused op
// against its composition, a blocked kernel against the whole), reporting the first element
// that differs.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "hpm/tensor/tensor.h"

namespace hpm::testing {

inline void expect_same_bits(const Tensor& actual, const Tensor& expected,
                             const std::string& what) {
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::size_t size = dtype_size(actual.dtype());
  const std::size_t bytes = static_cast<std::size_t>(actual.numel()) * size;
  const auto* pa = static_cast<const unsigned char*>(actual.raw_data());
  const auto* pb = static_cast<const unsigned char*>(expected.raw_data());
  std::size_t first = 0;
  while (first < bytes && pa[first] == pb[first]) ++first;
  EXPECT_EQ(first, bytes) << what << ": element " << first / size << " differs";
}

}  // namespace hpm::testing
