// Weights made elsewhere, in other precisions: PyTorch state dicts saved as BF16, F16 and F64
// (tests/io/fixtures/generate_half_weights.py) load into hpm's f32 mlp, cast on load, and give the
// logits PyTorch computes from the same file's weights; the non-strict load reports what was
// missing and unexpected; export to half precision and back through a checkpoint.
#include <gtest/gtest.h>

#include <cmath>

#include "common/temp_dir.h"
#include "hpm/autograd/grad_mode.h"
#include "hpm/io/safetensors.h"
#include "hpm/nn/layers.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/kernels.h"
#include "hpm/train/checkpoint.h"

namespace hpm {
namespace {

const std::string kFixtures = std::string(HPM_SOURCE_DIR) + "/tests/io/fixtures/";

std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 32),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 10)});
}

void expect_close(const Tensor& a, const Tensor& b, float tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_NEAR(a.data<float>()[i], b.data<float>()[i], tol) << what << " at " << i;
  }
}

TEST(HalfWeights, TorchStateDictsInBf16F16AndF64GiveTorchsLogits) {
  const io::SafetensorsFile ref = io::load_safetensors(kFixtures + "mlp_logits.safetensors");
  for (const char* tag : {"bf16", "f16", "f64"}) {
    const io::SafetensorsFile file =
        io::load_safetensors(kFixtures + "mlp_" + tag + ".safetensors");
    ASSERT_NE(file.tensors[0].second.dtype(), DType::F32) << tag;
    auto model = mlp();
    const nn::Module::LoadReport r = model->load_weights(file.tensors);
    EXPECT_EQ(r.loaded, 4u) << tag;
    EXPECT_EQ(r.cast, 4u) << tag;
    autograd::NoGradGuard no_grad;
    expect_close(model->forward(ref.at("inputs")), ref.at(std::string("logits_") + tag), 1e-5f,
                 tag);
  }
}

TEST(HalfWeights, NonStrictLoadsWhatMatchesAndReportsTheRest) {
  io::SafetensorsFile file = io::load_safetensors(kFixtures + "mlp_bf16.safetensors");
  // A state dict from a model with another head: "3.*" is missing, "head.weight" unexpected.
  io::NamedTensors partial;
  for (const auto& [name, t] : file.tensors)
    if (name.rfind("1.", 0) == 0) partial.emplace_back(name, t);
  partial.emplace_back("head.weight", Tensor::zeros({10, 32}));
  auto model = mlp();
  const Tensor head_before = model->state_dict()[2].second.clone();
  const nn::Module::LoadReport r = model->load_weights(partial, /*strict=*/false);
  EXPECT_EQ(r.loaded, 2u);
  EXPECT_EQ(r.missing, (std::vector<std::string>{"3.weight", "3.bias"}));
  EXPECT_EQ(r.unexpected, (std::vector<std::string>{"head.weight"}));
  expect_close(model->state_dict()[2].second, head_before, 0.0f, "a missing entry keeps its value");
  expect_close(model->state_dict()[0].second, kernels::to_f32(file.at("1.weight")), 0.0f,
               "a present entry is loaded");
  try {
    model->load_weights(partial, /*strict=*/true);
    FAIL() << "strict loading took a partial state dict";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "load_state_dict: missing entry '3.weight'");
  }
  partial.emplace_back("3.weight", Tensor::zeros({10, 31}));
  try {
    model->load_weights(partial, /*strict=*/false);
    FAIL() << "a wrong shape was loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "load_weights: '3.weight' has shape [10, 31] F32, the model expects [10, 32] F32");
  }
}

// A checkpoint's optimizer file is not needed to evaluate; its weights may be half precision.
TEST(HalfWeights, CheckpointsLoadWithoutOptimizerFileAndInBf16) {
  testing::TempDir dir;
  manual_seed(4);
  auto model = mlp();
  optim::SGD opt(model->named_parameters(), optim::SgdOptions{0.1f, 0.9f});
  const std::string saved = train::save_checkpoint(dir.path(), *model, opt, {});
  std::filesystem::remove(saved + "/optimizer.safetensors");
  auto again = mlp();
  train::load_checkpoint(dir.path(), *again, nullptr);
  expect_close(again->state_dict()[0].second, model->state_dict()[0].second, 0.0f, "weights");
  EXPECT_THROW(train::load_checkpoint(dir.path(), *again, &opt), std::exception)
      << "resuming needs the optimizer's state";
  const io::NamedTensors weights = train::load_checkpoint_weights(dir.path());
  EXPECT_EQ(weights.size(), 4u);
}

}  // namespace
}  // namespace hpm
