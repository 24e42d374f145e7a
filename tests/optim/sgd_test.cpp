// SGD's weight decay by parameter rank (nanoGPT's two groups), as AdamW's: with
// weight_decay_min_rank = 2 a matrix decays and a bias does not. The option was Adam's alone, and
// the configuration dropped it for SGD without a word: every bias and norm weight decayed.
#include <gtest/gtest.h>

#include "hpm/optim/optimizer.h"
#include "hpm/tensor/tensor.h"

namespace hpm::optim {
namespace {

TEST(Sgd, WeightDecaySkipsParametersBelowTheMinimumRank) {
  Tensor w = Tensor::from({1.0f, 2.0f, 3.0f, 4.0f}, {2, 2});
  Tensor b = Tensor::from({1.0f, 2.0f}, {2});
  for (Tensor* p : {&w, &b}) {
    p->set_requires_grad(true);
    p->set_grad(Tensor::zeros(p->shape()));
  }
  SgdOptions o;
  o.lr = 0.1f;
  o.weight_decay = 0.5f;
  o.weight_decay_min_rank = 2;
  SGD sgd({{"w", w}, {"b", b}}, o);
  sgd.clip_and_step(0.0f);
  // torch: p -= lr * (g + wd * p), so p * (1 - 0.05) where decayed.
  EXPECT_EQ(w.to_vector(), (std::vector<float>{0.95f, 1.9f, 2.85f, 3.8f}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{1.0f, 2.0f}));
}

}  // namespace
}  // namespace hpm::optim
