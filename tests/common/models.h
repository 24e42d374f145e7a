// Small GPT and ResNet fixtures shared by the strategy, pipeline and memory tests: models small
// enough to train a few steps in milliseconds, and batches of the kinds they take.
#pragma once
#include <cstdint>
#include <memory>

#include "hpm/nn/gpt.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/objective.h"
#include "hpm/nn/resnet.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/random.h"

namespace hpm::testing {

// 2 layers, 2 heads, 16 wide, block 8, vocabulary 32, tied head.
inline nn::GPTConfig tiny_gpt_config() {
  nn::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 8;
  c.vocab_size = 32;
  return c;
}

// The mlp (64 -> 32 -> 4) and the cnn (a 3x3 convolution to 8 channels, ReLU, 2x2 pooling, a
// linear head to 4 classes) of the device tests, on 1 x 8 x 8 images (image_batch).
inline std::shared_ptr<nn::Module> tiny_mlp() {
  Generator gen(3);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(64, 32, true, gen),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(32, 4, true, gen)});
}

inline std::shared_ptr<nn::Module> tiny_cnn() {
  Generator gen(4);
  nn::Conv2dOptions o;
  o.in_channels = 1;
  o.out_channels = 8;
  o.padding = 1;
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(o, gen), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(8 * 4 * 4, 4, true, gen)});
}

inline std::shared_ptr<nn::Module> tiny_gpt() {
  return std::make_shared<nn::GPT>(tiny_gpt_config());
}

// ResNet with two stages of one BasicBlock (8 and 16 channels) on 1 x 8 x 8 images, 4 classes.
inline std::shared_ptr<nn::Module> tiny_resnet() {
  nn::ResNetConfig c;
  c.in_channels = 1;
  c.num_classes = 4;
  c.widths = {8, 16};
  c.blocks = {1, 1};
  return std::make_shared<nn::ResNet>(c);
}

// `rows` windows of `block` token ids below `vocab` and their next tokens (a shifted copy with
// one fresh token at the end, as a corpus gives them).
inline nn::Batch token_batch(std::int64_t rows, std::int64_t block, std::int64_t vocab,
                             std::uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::zeros({rows, block}, DType::I64), y = Tensor::zeros({rows, block}, DType::I64);
  auto* px = x.data<std::int64_t>();
  auto* py = y.data<std::int64_t>();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::vector<std::int64_t> w(static_cast<std::size_t>(block + 1));
    for (auto& t : w) t = static_cast<std::int64_t>(gen.below(static_cast<std::uint64_t>(vocab)));
    for (std::int64_t t = 0; t < block; ++t) {
      px[r * block + t] = w[static_cast<std::size_t>(t)];
      py[r * block + t] = w[static_cast<std::size_t>(t + 1)];
    }
  }
  return {x, y};
}

// `rows` 1 x 8 x 8 standard-normal images and labels in [0, 4).
inline nn::Batch image_batch(std::int64_t rows, std::uint64_t seed) {
  Generator gen(seed);
  nn::Batch b{Tensor::randn({rows, 1, 8, 8}, gen), Tensor::zeros({rows}, DType::I64)};
  for (std::int64_t i = 0; i < rows; ++i)
    b.targets.data<std::int64_t>()[i] = static_cast<std::int64_t>(gen.below(4));
  return b;
}

// AdamW as torch_gpt.py configures it (decay on 2-D weights only), at a test-sized lr.
inline std::shared_ptr<optim::Optimizer> adamw(nn::Module& m) {
  optim::AdamOptions o;
  o.lr = 1e-2f;
  o.beta2 = 0.99f;
  o.weight_decay = 0.1f;
  o.weight_decay_min_rank = 2;
  return std::make_shared<optim::AdamW>(m.named_parameters(), o);
}

}  // namespace hpm::testing
