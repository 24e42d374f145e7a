// ResNet with BasicBlocks (He et al. 2016), torchvision's parameter names: the CIFAR-style
// ResNet-20/32/56 (three stages of 16, 32, 64 channels, 3x3 stem) and any depth and widths.
//
// Legend: N = batch, C = channels, H/W = height/width.
//
//   conv1 3x3, bn1, relu                               (N, widths[0], H, W)
//   layer{s}.{i}: BasicBlock, stride 2 at the first block of every stage but the first
//   global average pool, fc                            (N, num_classes)
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "hpm/nn/containers.h"
#include "hpm/nn/layers.h"

namespace hpm::nn {

struct ResNetConfig {
  std::int64_t in_channels = 1, num_classes = 10;
  std::vector<std::int64_t> widths = {16, 32, 64};  // channels per stage
  std::vector<std::int64_t> blocks = {3, 3, 3};     // BasicBlocks per stage: 3,3,3 is ResNet-20
};

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); the shortcut is the identity, or a 1x1
// convolution and BatchNorm ("downsample") where the stride or the width changes.
class BasicBlock : public Module {
 public:
  BasicBlock(std::int64_t in, std::int64_t out, int stride, Generator& gen);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "BasicBlock"; }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Sequential> downsample;  // null for the identity
};

class ResNet : public Module {
 public:
  explicit ResNet(const ResNetConfig& c, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;  // (N, C, H, W) -> (N, num_classes)
  // The stem, each BasicBlock, the head (pool and fc).
  std::vector<std::shared_ptr<Module>> blocks() const override { return blocks_; }
  std::string type_name() const override { return "ResNet"; }
  std::string extra_repr() const override;

 private:
  ResNetConfig c_;
  std::vector<std::shared_ptr<Module>> blocks_;
};

}  // namespace hpm::nn
