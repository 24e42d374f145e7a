// Incremental decoding with the key/value cache gives the logits a forward over the whole
// sequence gives at its last position; the documented errors.
#include "hpm/nn/gpt.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/models.h"
#include "hpm/autograd/grad_mode.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

// The shared tiny GPT, with a block and a vocabulary of their own so positions run out here.
GPTConfig small() {
  GPTConfig c = testing::tiny_gpt_config();
  c.block_size = 12;
  c.vocab_size = 20;
  return c;
}

TEST(GptDecode, CachedStepsEqualTheFullForward) {
  manual_seed(3);
  GPT model(small());
  model.eval();
  std::vector<std::int64_t> seq = {3, 1, 4, 1, 5, 9, 2, 6};
  KVCache cache;
  Tensor logits = model.decode(
      Tensor::from_i64(std::vector<std::int64_t>(seq.begin(), seq.begin() + 5), Shape{1, 5}),
      cache);
  for (std::size_t n = 5; n <= seq.size(); ++n) {
    NoGradGuard no_grad;
    const Tensor full = model.forward(
        Tensor::from_i64(std::vector<std::int64_t>(seq.begin(), seq.begin() + static_cast<long>(n)),
                         Shape{1, static_cast<std::int64_t>(n)}));
    const auto want = full.to_vector();
    const auto got = logits.to_vector();
    ASSERT_EQ(got.size(), 20u);
    for (std::size_t j = 0; j < 20; ++j)
      ASSERT_NEAR(got[j], want[(n - 1) * 20 + j], 1e-5f) << "position " << n - 1;
    EXPECT_EQ(cache.length, static_cast<std::int64_t>(n));
    if (n < seq.size())
      logits =
          model.decode(Tensor::from_i64(std::vector<std::int64_t>{seq[n]}, Shape{1, 1}), cache);
  }
}

TEST(GptDecode, RefusesWhatItCannotDo) {
  manual_seed(3);
  GPT model(small());
  KVCache cache;
  model.decode(Tensor::from_i64(std::vector<std::int64_t>{1, 2}, Shape{1, 2}), cache);
  EXPECT_THROW(model.decode(Tensor::from_i64(std::vector<std::int64_t>{1, 2}, Shape{1, 2}), cache),
               std::invalid_argument);
  KVCache full;
  model.decode(Tensor::zeros({1, 12}, DType::I64), full);
  try {
    model.decode(Tensor::zeros({1, 1}, DType::I64), full);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("13 tokens is longer than block_size 12"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hpm::nn
