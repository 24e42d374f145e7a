#include "hpm/data/image.h"

#include <gtest/gtest.h>

#include <numeric>

#include "hpm/data/input_pipeline.h"

namespace hpm::data {
namespace {

Tensor ramp(const Shape& s) {
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  std::iota(v.begin(), v.end(), 1.0f);
  return Tensor::from(v, s);
}

TEST(Image, RandomCropIsAWindowOfThePaddedImage) {
  const Tensor img = ramp({1, 5, 6});
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    Generator gen(seed);
    const Tensor out = random_crop(img, 2, 4, 3, gen);
    ASSERT_EQ(out.shape(), (Shape{1, 4, 3}));
    // Find the offset: the crop must equal padded[top:top+4, left:left+3] for some top, left.
    bool found = false;
    for (int top = 0; top <= 5 && !found; ++top)
      for (int left = 0; left <= 7 && !found; ++left) {
        bool same = true;
        for (int y = 0; y < 4 && same; ++y)
          for (int x = 0; x < 3 && same; ++x) {
            const int sy = top + y - 2, sx = left + x - 2;
            const float expect =
                (sy < 0 || sy >= 5 || sx < 0 || sx >= 6) ? 0.0f : img.data<float>()[sy * 6 + sx];
            same = out.data<float>()[y * 3 + x] == expect;
          }
        found = same;
      }
    EXPECT_TRUE(found) << "seed " << seed;
  }
  Generator gen(0);
  EXPECT_THROW(random_crop(img, 0, 6, 6, gen), std::invalid_argument);
}

TEST(Image, FlipMirrorsRowsHalfTheTime) {
  const Tensor img = ramp({2, 2, 3});
  int flipped = 0;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    Generator gen(seed);
    const Tensor out = random_flip_left_right(img, gen);
    if (out.to_vector() != img.to_vector()) {
      ++flipped;
      EXPECT_EQ(out.to_vector(), (std::vector<float>{3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10}));
    }
  }
  EXPECT_GT(flipped, 70);
  EXPECT_LT(flipped, 130);
}

TEST(Image, NormalizePerChannel) {
  const Tensor img = Tensor::from({1, 2, 3, 4, 10, 20, 30, 40}, {2, 2, 2});
  const Tensor out = normalize(img, {1.0f, 10.0f}, {2.0f, 10.0f});
  EXPECT_EQ(out.to_vector(), (std::vector<float>{0, 0.5f, 1, 1.5f, 0, 1, 2, 3}));
  EXPECT_THROW(normalize(img, {1, 2, 3}, {1}), std::invalid_argument);
}

TEST(Image, ResizeBilinearMatchesPyTorch) {
  // torch.nn.functional.interpolate(x, size=(4, 4), mode="bilinear", align_corners=False) for
  // x = [[1, 2], [3, 4]].
  const Tensor out = resize_bilinear(Tensor::from({1, 2, 3, 4}, {1, 2, 2}), 4, 4);
  const std::vector<float> expected = {1.0f, 1.25f, 1.75f, 2.0f, 1.5f, 1.75f, 2.25f, 2.5f,
                                       2.5f, 2.75f, 3.25f, 3.5f, 3.0f, 3.25f, 3.75f, 4.0f};
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_FLOAT_EQ(out.to_vector()[i], expected[i]) << i;
}

LabelledData tiny(std::int64_t n) {
  LabelledData d;
  d.inputs = ramp({n, 1, 6, 6});
  std::vector<std::int64_t> labels(static_cast<std::size_t>(n));
  std::iota(labels.begin(), labels.end(), 0);
  d.labels = Tensor::from_i64(labels, {n});
  return d;
}

std::vector<std::vector<float>> run(const Dataset& d, std::int64_t epoch = 0) {
  std::vector<std::vector<float>> out;
  auto it = d.make_iterator(epoch);
  Element e;
  while (it->next(e)) {
    out.push_back(e[0].to_vector());
    for (auto l : e[1].to_vector_i64()) out.back().push_back(static_cast<float>(l));
  }
  return out;
}

TEST(Pipeline, AugmentationIsDeterministicAcrossParallelismAndVariesByEpoch) {
  const LabelledData data = tiny(40);
  InputPipelineSpec spec;
  spec.shuffle_buffer = -1;
  spec.seed = 9;
  spec.batch_size = 8;
  spec.augment = {{"random_crop", 2, 6, 6, {}, {}},
                  {"random_flip", 0, 0, 0, {}, {}},
                  {"normalize", 0, 0, 0, {0.5f}, {2.0f}}};
  spec.parallel_calls = 1;
  const auto sequential = run(build_input_pipeline(data, spec));
  spec.parallel_calls = 2;
  EXPECT_EQ(run(build_input_pipeline(data, spec)), sequential);
  spec.parallel_calls = kAutotune;
  EXPECT_EQ(run(build_input_pipeline(data, spec)), sequential);
  EXPECT_NE(run(build_input_pipeline(data, spec), 1), sequential);
  EXPECT_EQ(sequential.size(), 5u);
}

TEST(Pipeline, ResumesMidEpochExactly) {
  const LabelledData data = tiny(48);
  InputPipelineSpec spec;
  spec.shuffle_buffer = 10;
  spec.seed = 4;
  spec.batch_size = 4;
  spec.parallel_calls = 2;
  spec.augment = {{"random_crop", 1, 6, 6, {}, {}}};
  const Dataset d = build_input_pipeline(data, spec);
  const auto full = run(d);
  auto it = d.make_iterator();
  Element e;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(it->next(e));
  StateWriter w;
  it->save(w);
  auto resumed = build_input_pipeline(data, spec).make_iterator();
  StateReader r(w.bytes());
  resumed->restore(r);
  std::vector<std::vector<float>> rest;
  while (resumed->next(e)) {
    rest.push_back(e[0].to_vector());
    for (auto l : e[1].to_vector_i64()) rest.back().push_back(static_cast<float>(l));
  }
  EXPECT_EQ(rest, std::vector<std::vector<float>>(full.begin() + 5, full.end()));
}

TEST(Pipeline, RejectsUnknownOps) {
  InputPipelineSpec spec;
  spec.augment = {{"rotate", 0, 0, 0, {}, {}}};
  EXPECT_THROW(build_input_pipeline(tiny(4), spec), std::invalid_argument);
}

}  // namespace
}  // namespace hpm::data
