// PNG and JPEG decoding (libpng, libjpeg-turbo) into float images, and PNG encoding (for
// `hpm data convert --image-format png`). Safe to call from parallel map workers.
#pragma once
#include <string>
#include <string_view>

#include "hpm/tensor/tensor.h"

namespace hpm::data {

// (C, H, W) F32 in [0, 1]; C = 1 for grey images, 3 for colour (alpha dropped). Throws DataError
// ("decode_png" / "decode_jpeg") for corrupt or truncated data.
Tensor decode_png(std::string_view bytes);
Tensor decode_jpeg(std::string_view bytes);
// Chooses by the magic bytes.
Tensor decode_image(std::string_view bytes);
// 8-bit grey (C = 1) or RGB (C = 3) PNG from a (C, H, W) F32 image in [0, 1] (values clamped).
std::string encode_png(const Tensor& image);

}  // namespace hpm::data
