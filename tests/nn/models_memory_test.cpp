// Recomputation and offload on models that are not stacks: a GPT seen as its blocks (embeddings,
// transformer blocks, head) gives the plain model's loss and gradients when its blocks are
// recomputed (every block; sqrt(n) segments) or its activations offloaded; a ResNet the same.
#include <gtest/gtest.h>

#include <cmath>

#include "common/models.h"
#include "common/training.h"
#include "hpm/nn/offload.h"
#include "hpm/nn/recompute.h"

namespace hpm::nn {
namespace {

struct Grads {
  float loss;
  std::vector<float> grads;
};

// Loss and gradients of `run` (the model, or a wrapper sharing its blocks) on one batch.
Grads step(Module& run, Module& model, const Objective& objective, const Batch& b) {
  model.zero_grad();
  ObjectiveResult r = objective.compute(run.forward(b.inputs), b);
  r.loss.backward();
  return {r.loss.item(), testing::flat_grads(model)};
}

void expect_same(const Grads& a, const Grads& b, const std::string& what) {
  EXPECT_FLOAT_EQ(a.loss, b.loss) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    ASSERT_NEAR(a.grads[i], b.grads[i], 1e-6f + 1e-5f * std::abs(a.grads[i])) << what << " " << i;
}

TEST(ModelMemory, RecomputedAndOffloadedGptBlocksGiveThePlainGradients) {
  manual_seed(3);
  const auto gpt = testing::tiny_gpt();
  const LanguageModelling objective;
  const Batch b = testing::token_batch(4, 8, 32, 9);
  const Grads plain = step(*gpt, *gpt, objective, b);
  const auto blocks = as_sequential(gpt);
  EXPECT_EQ(blocks->size(), 4u) << "embeddings, 2 transformer blocks, head";
  for (int every : {1, 2}) {
    auto recomputed = with_recomputation(blocks, every, RecomputeMode::Always);
    expect_same(plain, step(*recomputed, *gpt, objective, b),
                "recompute every " + std::to_string(every));
  }
  auto offloaded = with_offload(blocks, OffloadOptions{0});
  expect_same(plain, step(*offloaded, *gpt, objective, b), "offload");
  EXPECT_GT(offloaded->stats().storages_offloaded, 0u);
}

TEST(ModelMemory, RecomputedAndOffloadedResNetBlocksGiveThePlainGradients) {
  manual_seed(3);
  const auto resnet = testing::tiny_resnet();
  const Classification objective;
  const Batch b = testing::image_batch(6, 4);
  // BatchNorm's running statistics move on every training forward, recomputed ones included
  // (as PyTorch's checkpoint does); the gradients are what must agree.
  const Grads plain = step(*resnet, *resnet, objective, b);
  auto recomputed = with_recomputation(as_sequential(resnet), 1, RecomputeMode::Always);
  expect_same(plain, step(*recomputed, *resnet, objective, b), "recompute every block");
  auto offloaded = with_offload(as_sequential(resnet), OffloadOptions{0});
  expect_same(plain, step(*offloaded, *resnet, objective, b), "offload");
  EXPECT_GT(offloaded->stats().storages_offloaded, 0u);
}

TEST(ModelMemory, AModuleWithoutBlocksIsRefusedByName) {
  try {
    as_sequential(std::make_shared<Linear>(2, 2));
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Linear presents no blocks"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hpm::nn
