// Containers and modules of several inputs: Residual adds its input, ModuleList holds without
// computing, Attention takes (q, k, v) through forward_inputs, and a one-input module given two
// says so.
#include "hpm/nn/containers.h"

#include <gtest/gtest.h>

#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::nn {
namespace {

TEST(Containers, ResidualAddsItsInputAndModuleListDoesNotCompute) {
  Generator g(1);
  auto lin = std::make_shared<Linear>(4, 4, true, g);
  Residual res(lin);
  const Tensor x = Tensor::randn({3, 4}, g);
  const auto want = add(x, lin->forward(x)).to_vector();
  EXPECT_EQ(res.forward(x).to_vector(), want);
  EXPECT_EQ(res.named_parameters().front().first, "fn.weight");
  ModuleList list({lin, std::make_shared<ReLU>()});
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list.named_parameters().front().first, "0.weight");
  EXPECT_THROW(list.forward(x), std::logic_error);
}

TEST(Containers, AttentionTakesQueryKeyAndValue) {
  Generator g(2);
  const Tensor q = Tensor::randn({2, 5, 4}, g), k = Tensor::randn({2, 7, 4}, g),
               v = Tensor::randn({2, 7, 4}, g);
  Attention attend(false);
  std::shared_ptr<Module> as_module = std::make_shared<Attention>(true);
  EXPECT_EQ(attend({q, k, v}).to_vector(), scaled_dot_product_attention(q, k, v).to_vector());
  EXPECT_EQ((*as_module)({q, q, q}).to_vector(),
            scaled_dot_product_attention(q, q, q, true).to_vector());
  EXPECT_EQ(as_module->forward(q).to_vector(),
            scaled_dot_product_attention(q, q, q, true).to_vector());
  try {
    attend({q, k});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("three inputs"), std::string::npos) << e.what();
  }
  Linear one(4, 2);
  try {
    one({q, k});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Linear takes one input, got 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hpm::nn
