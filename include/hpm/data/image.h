// Image transformations for the input pipeline, on float tensors (C,H,W) or (H,W). Random ones
// take a Generator, so a map function seeded per element (see augment_seed) is deterministic and
// thread-safe inside a parallel map.
#pragma once
#include <cstdint>

#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

namespace hpm::data {

// Zero-pads by `padding` on every side, then cuts a random out_h x out_w window (the padded
// random crop of the CIFAR/Fashion-MNIST recipes).
Tensor random_crop(const Tensor& image, int padding, std::int64_t out_h, std::int64_t out_w,
                   Generator& gen);
// Mirrors the last dimension with probability 1/2.
Tensor random_flip_left_right(const Tensor& image, Generator& gen);
// (x - mean) / std, per channel when mean/std have one value per channel, else one value.
Tensor normalize(const Tensor& image, const std::vector<float>& mean,
                 const std::vector<float>& std);
// Bilinear resize of the last two dimensions (align_corners = false, as PyTorch and TF2).
Tensor resize_bilinear(const Tensor& image, std::int64_t out_h, std::int64_t out_w);
// I64 or F32 to F32, with a scale (e.g. 1/255).
Tensor cast_to_f32(const Tensor& t, float scale = 1.0f);

// A seed for element `index` of pass `epoch`: mixing, so neighbouring indices are unrelated.
std::uint64_t augment_seed(std::uint64_t seed, std::int64_t epoch, std::int64_t index);

}  // namespace hpm::data
