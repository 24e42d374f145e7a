#include "hpm/data/image_codec.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <vector>

#include "hpm/data/dataset.h"

namespace hpm::data {

namespace {

// Interleaved 8-bit (H, W, C) to planar float (C, H, W) in [0, 1].
Tensor planar(const unsigned char* px, std::int64_t h, std::int64_t w, std::int64_t c) {
  Tensor out = Tensor::empty({c, h, w});
  float* d = out.data<float>();
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x)
      for (std::int64_t k = 0; k < c; ++k)
        d[(k * h + y) * w + x] = px[(y * w + x) * c + k] / 255.0f;
  return out;
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

// libjpeg prints warnings (e.g. "Premature end of JPEG file") to stderr and goes on with made-up
// pixels; here a warning is kept and turned into an error after decoding, so a corrupt record is
// reported rather than trained on.
void jpeg_quiet(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (err->message[0] == '\0') (*cinfo->err->format_message)(cinfo, err->message);
}

void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

}  // namespace

Tensor decode_png(std::string_view bytes) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    const std::string msg = image.message;
    png_image_free(&image);
    throw DataError("decode_png", msg);
  }
  const bool colour = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  image.format = colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  const std::int64_t c = colour ? 3 : 1;
  std::vector<unsigned char> px(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, px.data(), 0, nullptr)) {
    const std::string msg = image.message;
    png_image_free(&image);
    throw DataError("decode_png", msg);
  }
  return planar(px.data(), image.height, image.width, c);
}

Tensor decode_jpeg(std::string_view bytes) {
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.output_message = jpeg_quiet;
  std::vector<unsigned char> px;
  std::int64_t h = 0, w = 0, c = 0;
  // libjpeg reports errors by longjmp: nothing with a destructor may live between here and there.
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw DataError("decode_jpeg", err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  h = cinfo.output_height;
  w = cinfo.output_width;
  c = cinfo.output_components;
  px.resize(static_cast<std::size_t>(h * w * c));
  while (cinfo.output_scanline < cinfo.output_height) {
    unsigned char* row = px.data() + static_cast<std::size_t>(cinfo.output_scanline) *
                                         static_cast<std::size_t>(w * c);
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  const long warnings = cinfo.err->num_warnings;
  jpeg_destroy_decompress(&cinfo);
  if (warnings > 0)
    throw DataError("decode_jpeg", std::string("corrupt or truncated JPEG: ") + err.message);
  return planar(px.data(), h, w, c);
}

Tensor decode_image(std::string_view bytes) {
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0)
    return decode_png(bytes);
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xff &&
      static_cast<unsigned char>(bytes[1]) == 0xd8) {
    return decode_jpeg(bytes);
  }
  throw DataError("decode_image", "neither PNG nor JPEG (unknown magic bytes)");
}

std::string encode_png(const Tensor& image) {
  if (image.dim() != 3 || (image.size(0) != 1 && image.size(0) != 3)) {
    throw std::invalid_argument("encode_png: expected (1 or 3, H, W), got " + image.shape().str());
  }
  const std::int64_t c = image.size(0), h = image.size(1), w = image.size(2);
  std::vector<unsigned char> px(static_cast<std::size_t>(c * h * w));
  const float* s = image.data<float>();
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x)
      for (std::int64_t k = 0; k < c; ++k)
        px[static_cast<std::size_t>((y * w + x) * c + k)] = static_cast<unsigned char>(
            std::clamp(s[(k * h + y) * w + x], 0.0f, 1.0f) * 255.0f + 0.5f);
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, px.data(), 0, nullptr)) {
    throw std::runtime_error(std::string("encode_png: ") + img.message);
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&img, out.data(), &size, 0, px.data(), 0, nullptr)) {
    throw std::runtime_error(std::string("encode_png: ") + img.message);
  }
  out.resize(size);
  return out;
}

}  // namespace hpm::data
