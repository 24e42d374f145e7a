#include "hpm/data/image.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace hpm::data {

namespace {
struct Planes {
  std::int64_t planes, h, w;
};
Planes planes_of(const Tensor& t, const char* op) {
  if (t.dim() < 2)
    throw std::invalid_argument(std::string(op) + ": expected (..., H, W), got " + t.shape().str());
  return {t.numel() / (t.size(-2) * t.size(-1)), t.size(-2), t.size(-1)};
}
Shape with_hw(const Tensor& t, std::int64_t h, std::int64_t w) {
  Shape s = t.shape();
  s[-2] = h;
  s[-1] = w;
  return s;
}
}  // namespace

Tensor random_crop(const Tensor& image, int padding, std::int64_t out_h, std::int64_t out_w,
                   Generator& gen) {
  const Planes p = planes_of(image, "random_crop");
  const std::int64_t ph = p.h + 2 * padding, pw = p.w + 2 * padding;
  if (out_h > ph || out_w > pw || out_h <= 0 || out_w <= 0) {
    throw std::invalid_argument("random_crop: window " + std::to_string(out_h) + "x" +
                                std::to_string(out_w) + " larger than the padded image " +
                                std::to_string(ph) + "x" + std::to_string(pw));
  }
  // Offsets of the window in padded coordinates.
  const auto top = static_cast<std::int64_t>(gen.below(static_cast<std::uint64_t>(ph - out_h + 1)));
  const auto left =
      static_cast<std::int64_t>(gen.below(static_cast<std::uint64_t>(pw - out_w + 1)));
  Tensor out = Tensor::empty(with_hw(image, out_h, out_w));
  const float* src = image.data<float>();
  float* dst = out.data<float>();
  for (std::int64_t pl = 0; pl < p.planes; ++pl) {
    for (std::int64_t y = 0; y < out_h; ++y) {
      const std::int64_t sy = top + y - padding;
      float* d = dst + (pl * out_h + y) * out_w;
      if (sy < 0 || sy >= p.h) {
        std::fill(d, d + out_w, 0.0f);
        continue;
      }
      const float* s = src + (pl * p.h + sy) * p.w;
      // Columns of the window that fall inside the image: [x0, x1).
      const std::int64_t x0 = std::clamp<std::int64_t>(padding - left, 0, out_w);
      const std::int64_t x1 = std::clamp<std::int64_t>(p.w + padding - left, x0, out_w);
      for (std::int64_t x = 0; x < x0; ++x) d[x] = 0.0f;
      for (std::int64_t x = x0; x < x1; ++x) d[x] = s[left + x - padding];
      for (std::int64_t x = x1; x < out_w; ++x) d[x] = 0.0f;
    }
  }
  return out;
}

Tensor random_flip_left_right(const Tensor& image, Generator& gen) {
  const Planes p = planes_of(image, "random_flip_left_right");
  if (gen.uniform() >= 0.5f) return image;
  Tensor out = Tensor::empty(image.shape());
  const float* src = image.data<float>();
  float* dst = out.data<float>();
  for (std::int64_t r = 0; r < p.planes * p.h; ++r)
    for (std::int64_t x = 0; x < p.w; ++x) dst[r * p.w + x] = src[r * p.w + (p.w - 1 - x)];
  return out;
}

Tensor normalize(const Tensor& image, const std::vector<float>& mean,
                 const std::vector<float>& std) {
  const Planes p = planes_of(image, "normalize");
  const std::int64_t channels = image.dim() >= 3 ? image.size(-3) : 1;
  auto pick = [&](const std::vector<float>& v, const char* what) {
    if (v.size() != 1 && static_cast<std::int64_t>(v.size()) != channels) {
      throw std::invalid_argument(std::string("normalize: ") + what + " has " +
                                  std::to_string(v.size()) + " values for " +
                                  std::to_string(channels) + " channels");
    }
    return v;
  };
  const std::vector<float> m = pick(mean, "mean"), s = pick(std, "std");
  Tensor out = Tensor::empty(image.shape());
  const float* src = image.data<float>();
  float* dst = out.data<float>();
  const std::int64_t hw = p.h * p.w;
  for (std::int64_t pl = 0; pl < p.planes; ++pl) {
    const std::size_t c = m.size() == 1 ? 0 : static_cast<std::size_t>(pl % channels);
    const float mu = m[c], inv = 1.0f / s[c];
    for (std::int64_t k = 0; k < hw; ++k) dst[pl * hw + k] = (src[pl * hw + k] - mu) * inv;
  }
  return out;
}

Tensor resize_bilinear(const Tensor& image, std::int64_t out_h, std::int64_t out_w) {
  const Planes p = planes_of(image, "resize_bilinear");
  if (out_h <= 0 || out_w <= 0)
    throw std::invalid_argument("resize_bilinear: size must be positive");
  Tensor out = Tensor::empty(with_hw(image, out_h, out_w));
  const float* src = image.data<float>();
  float* dst = out.data<float>();
  const double sy = static_cast<double>(p.h) / static_cast<double>(out_h);
  const double sx = static_cast<double>(p.w) / static_cast<double>(out_w);
  for (std::int64_t pl = 0; pl < p.planes; ++pl)
    for (std::int64_t y = 0; y < out_h; ++y) {
      const double fy = std::max(0.0, (static_cast<double>(y) + 0.5) * sy - 0.5);
      const auto y0 = std::min<std::int64_t>(static_cast<std::int64_t>(fy), p.h - 1);
      const std::int64_t y1 = std::min<std::int64_t>(y0 + 1, p.h - 1);
      const double wy = fy - static_cast<double>(y0);
      for (std::int64_t x = 0; x < out_w; ++x) {
        const double fx = std::max(0.0, (static_cast<double>(x) + 0.5) * sx - 0.5);
        const auto x0 = std::min<std::int64_t>(static_cast<std::int64_t>(fx), p.w - 1);
        const std::int64_t x1 = std::min<std::int64_t>(x0 + 1, p.w - 1);
        const double wx = fx - static_cast<double>(x0);
        const float* s = src + pl * p.h * p.w;
        const double top = s[y0 * p.w + x0] * (1 - wx) + s[y0 * p.w + x1] * wx;
        const double bottom = s[y1 * p.w + x0] * (1 - wx) + s[y1 * p.w + x1] * wx;
        dst[(pl * out_h + y) * out_w + x] = static_cast<float>(top * (1 - wy) + bottom * wy);
      }
    }
  return out;
}

Tensor cast_to_f32(const Tensor& t, float scale) {
  Tensor out = Tensor::empty(t.shape());
  float* d = out.data<float>();
  if (t.dtype() == DType::F32) {
    const float* s = t.data<float>();
    for (std::int64_t i = 0; i < t.numel(); ++i) d[i] = s[i] * scale;
  } else if (t.dtype() == DType::I64) {
    const auto* s = t.data<std::int64_t>();
    for (std::int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<float>(s[i]) * scale;
  } else if (t.dtype() == DType::I8) {
    const auto* s = static_cast<const unsigned char*>(t.raw_data());
    for (std::int64_t i = 0; i < t.numel(); ++i) d[i] = static_cast<float>(s[i]) * scale;
  } else {
    throw std::invalid_argument(std::string("cast_to_f32: unsupported dtype ") +
                                dtype_name(t.dtype()));
  }
  return out;
}

std::uint64_t augment_seed(std::uint64_t seed, std::int64_t epoch, std::int64_t index) {
  std::uint64_t z = seed ^ (static_cast<std::uint64_t>(epoch) * 0x9e3779b97f4a7c15ULL) ^
                    (static_cast<std::uint64_t>(index) * 0xbf58476d1ce4e5b9ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace hpm::data
