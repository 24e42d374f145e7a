// Every row of y (rows x cols, F32) set to bias (cols), on the current device's stream.
#pragma once
#include <cstdint>

namespace hpm::cuda {
void bias_rows(float* y, const float* bias, std::int64_t rows, std::int64_t cols);
}  // namespace hpm::cuda
