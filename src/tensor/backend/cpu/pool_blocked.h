// Max pooling 2x2/2 between a convolution's output in oneDNN's channel-blocked layout (aBcd16b:
// [N][C/16][H][W][16], channels padded to a multiple of 16) and plain NCHW tensors, for the fused
// Conv2d + ReLU + MaxPool2d op (conv_dnnl.cpp): the convolution's output never exists in the
// plain layout, which saves the reorder to it forward and from it backward.
#pragma once
#include <cstdint>

namespace hpm::cpu {

// Whether the functions below can run here: they are written for AVX-512, the only instruction
// set on which oneDNN picks 16-channel blocks.
bool channel_block_pooling_available();

// src (n, c, h, w) blocked -> y (n, c, h/2, w/2) plain, argmax the winner's index in its (h, w)
// plane: the values and indices of max_pool2d_forward (among equals the first in row-major order;
// NaN wins, though of several NaNs in a window it may pick another). src in f32 or bf16 (a bf16
// convolution's output); y in f32, which holds every bf16 value exactly.
void max_pool_2x2_from_channel_blocks(const float* src, std::int64_t n, std::int64_t c,
                                      std::int64_t h, std::int64_t w, float* y,
                                      std::int32_t* argmax);
void max_pool_2x2_from_channel_blocks_bf16(const std::uint16_t* src, std::int64_t n, std::int64_t c,
                                           std::int64_t h, std::int64_t w, float* y,
                                           std::int32_t* argmax);

// The gradient of that pooling: grad_y (n, c, h/2, w/2) plain -> dst (n, c, h, w) blocked, each
// element written once (grad_y at the winner, 0 elsewhere, in the padding channels too), in f32
// or rounded to bf16 (to nearest even, as oneDNN's reorders round).
void max_unpool_2x2_to_channel_blocks(const float* grad_y, const std::int32_t* argmax,
                                      std::int64_t n, std::int64_t c, std::int64_t h,
                                      std::int64_t w, float* dst);
void max_unpool_2x2_to_channel_blocks_bf16(const float* grad_y, const std::int32_t* argmax,
                                           std::int64_t n, std::int64_t c, std::int64_t h,
                                           std::int64_t w, std::uint16_t* dst);

}  // namespace hpm::cpu
