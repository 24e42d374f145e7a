#include "hpm/data/image_codec.h"

#include <gtest/gtest.h>
#include <jpeglib.h>

#include <cmath>
#include <vector>

#include "hpm/data/dataset.h"

namespace hpm::data {
namespace {

Tensor gradient_image(std::int64_t c, std::int64_t h, std::int64_t w) {
  Tensor t = Tensor::empty({c, h, w});
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(i % 256) / 255.0f;
  return t;
}

// A JPEG made with libjpeg directly, to check decoding against known pixels.
std::string encode_jpeg(const Tensor& img, int quality) {
  const auto c = static_cast<int>(img.size(0)), h = static_cast<int>(img.size(1)),
             w = static_cast<int>(img.size(2));
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  std::vector<unsigned char> row(static_cast<std::size_t>(w * c));
  while (cinfo.next_scanline < cinfo.image_height) {
    const int y = static_cast<int>(cinfo.next_scanline);
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        row[static_cast<std::size_t>(x * c + k)] =
            static_cast<unsigned char>(img.data<float>()[(k * h + y) * w + x] * 255.0f + 0.5f);
    unsigned char* p = row.data();
    jpeg_write_scanlines(&cinfo, &p, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buf), size);
  jpeg_destroy_compress(&cinfo);
  free(buf);
  return out;
}

TEST(ImageCodec, PngRoundTripsExactly) {
  for (std::int64_t c : {1, 3}) {
    const Tensor img = gradient_image(c, 7, 9);
    const std::string png = encode_png(img);
    const Tensor back = decode_image(png);
    ASSERT_EQ(back.shape(), img.shape());
    for (std::int64_t i = 0; i < img.numel(); ++i)
      EXPECT_FLOAT_EQ(back.data<float>()[i], img.data<float>()[i]);
  }
}

TEST(ImageCodec, JpegDecodesCloseToTheSource) {
  const Tensor img = gradient_image(3, 16, 16);
  const Tensor back = decode_image(encode_jpeg(img, 95));
  ASSERT_EQ(back.shape(), img.shape());
  double err = 0;
  for (std::int64_t i = 0; i < img.numel(); ++i)
    err += std::fabs(back.data<float>()[i] - img.data<float>()[i]);
  EXPECT_LT(err / static_cast<double>(img.numel()), 0.05);
}

TEST(ImageCodec, CorruptDataIsADataError) {
  std::string png = encode_png(gradient_image(1, 8, 8));
  png.resize(png.size() / 2);
  EXPECT_THROW(decode_png(png), DataError);
  std::string jpeg = encode_jpeg(gradient_image(1, 8, 8), 90);
  EXPECT_THROW(decode_jpeg(jpeg.substr(0, 20)), DataError);
  // Cut inside the entropy-coded data: libjpeg only warns; hpm reports it.
  EXPECT_THROW(decode_jpeg(jpeg.substr(0, jpeg.size() - 40)), DataError);
  EXPECT_THROW(decode_image("GIF89a...."), DataError);
}

}  // namespace
}  // namespace hpm::data
