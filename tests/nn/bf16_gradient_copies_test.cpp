// A GPT's residual stream under bf16 autocast: each block's norms add their dx into the stream's
// gradient, and the bf16 product before them (the MLP's out product, the attention's) rounds that
// sum first thing. The norm's backward writes the rounding in the same pass
// (autograd::offer_bf16_copy), and the product takes it instead of rounding again: the same
// gradients bit for bit, two rounding passes a block fewer, and no copy left unclaimed.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/models.h"
#include "hpm/autograd/autocast.h"
#include "hpm/autograd/node.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/objective.h"
#include "hpm/tensor/backend.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

struct Backward {
  std::vector<std::vector<float>> grads;
  std::uint64_t roundings = 0;  // to_bf16 launches during the backward
  std::size_t left = 0;         // copies no product took
};

Backward gpt_backward(bool copies) {
  autograd::set_bf16_gradient_copies(copies);
  manual_seed(11);
  auto config = testing::tiny_gpt_config();
  config.n_layer = 3;
  config.n_embd = 32;
  auto model = std::make_shared<GPT>(config);
  const Batch batch = testing::token_batch(4, 8, 32, 2);
  Backward out;
  {
    autograd::AutocastScope bf16(autograd::Precision::BF16);
    const Tensor loss = LanguageModelling().compute(model->forward(batch.inputs), batch).loss;
    const std::uint64_t before = dispatch_count(DeviceType::kCpu, Op::kToBf16);
    loss.backward();
    out.roundings = dispatch_count(DeviceType::kCpu, Op::kToBf16) - before;
    out.left = autograd::bf16_copies_left_by_last_backward();
  }
  for (const Tensor& p : model->parameters()) out.grads.push_back(p.grad().to_vector());
  autograd::set_bf16_gradient_copies(true);
  return out;
}

TEST(Bf16GradientCopies, AGptsProductsTakeTheNormsRoundingsWithTheSameGradients) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const Backward without = gpt_backward(false), with = gpt_backward(true);
  ASSERT_EQ(with.grads.size(), without.grads.size());
  for (std::size_t i = 0; i < with.grads.size(); ++i)
    EXPECT_EQ(with.grads[i], without.grads[i]) << "parameter " << i;
  // Per block: the MLP's out product takes the next block's (or the final norm's) first norm's
  // copy, the attention's out product the block's second norm's.
  EXPECT_EQ(without.roundings - with.roundings, 2u * 3u)
      << without.roundings << " roundings without copies, " << with.roundings << " with";
  EXPECT_EQ(with.left, 0u);
}

}  // namespace
}  // namespace hpm::nn
