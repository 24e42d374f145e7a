// nn::sample against the model itself: with the key/value cache it draws the very tokens the
// window re-run draws (through the cache's refill once the window is full), top_k = 1 is the
// greedy argmax of the full forward, and its refusals.
#include "hpm/nn/sampling.h"

#include <gtest/gtest.h>

#include "common/models.h"
#include "hpm/autograd/grad_mode.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

// The shared tiny GPT (block 8), with a vocabulary of its own.
GPTConfig tiny() {
  GPTConfig c = testing::tiny_gpt_config();
  c.vocab_size = 20;
  return c;
}

TEST(Sample, TheCacheDrawsWhatReRunningTheWindowDraws) {
  Generator gen(3);
  GPT model(tiny(), gen);
  SampleOptions o;
  o.tokens = 25;  // past block_size: the cache is refilled as the window slides
  o.temperature = 1.0f;
  o.seed = 11;
  std::vector<std::int64_t> seen;
  const auto cached = sample(model, {1, 2, 3}, o, [&](std::int64_t id) { seen.push_back(id); });
  o.no_cache = true;
  const auto rerun = sample(model, {1, 2, 3}, o);
  ASSERT_EQ(cached.size(), 25u);
  EXPECT_EQ(cached, rerun);
  EXPECT_EQ(seen, cached) << "on_token sees each id as drawn";
  EXPECT_TRUE(model.is_training()) << "the model's mode is given back";
}

TEST(Sample, TopOneIsTheGreedyArgmaxOfTheFullForward) {
  Generator gen(5);
  GPT model(tiny(), gen);
  SampleOptions o;
  o.tokens = 12;
  o.top_k = 1;
  std::vector<std::int64_t> window = {4, 7, 1, 9, 2, 2, 5, 0, 3, 8};  // longer than the block
  const auto drawn = sample(model, window, o);
  window.erase(window.begin(), window.end() - 8);
  NoGradGuard no_grad;
  model.eval();
  for (std::int64_t id : drawn) {
    const auto t = static_cast<std::int64_t>(window.size());
    const std::vector<float> last = model.forward(Tensor::from_i64(window, Shape{1, t}))
                                        .reshape({t, 20})
                                        .narrow(t - 1, 1)
                                        .to_vector();
    EXPECT_EQ(id, std::max_element(last.begin(), last.end()) - last.begin());
    window.push_back(id);
    if (window.size() > 8) window.erase(window.begin());
  }
}

TEST(Sample, DrawsOnlyUsableIdsAndRefusesBadInput) {
  Generator gen(7);
  GPT model(tiny(), gen);
  SampleOptions o;
  o.tokens = 50;
  o.temperature = 5.0f;  // nearly uniform: every id is likely to come up
  o.usable_vocab = 6;
  for (std::int64_t id : sample(model, {1}, o)) EXPECT_LT(id, 6);
  EXPECT_THROW(sample(model, {}, o), std::invalid_argument);
  EXPECT_THROW(sample(model, {20}, o), std::invalid_argument);
  o.temperature = 0.0f;
  EXPECT_THROW(sample(model, {1}, o), std::invalid_argument);
}

}  // namespace
}  // namespace hpm::nn
