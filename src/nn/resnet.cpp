#include "hpm/nn/resnet.h"

#include <stdexcept>

namespace hpm::nn {

namespace {

std::shared_ptr<Conv2d> conv(std::int64_t in, std::int64_t out, int kernel, int stride,
                             Generator& gen) {
  return std::make_shared<Conv2d>(Conv2dOptions{in, out, kernel, stride, kernel / 2, false}, gen);
}

std::shared_ptr<BatchNorm2d> bn(std::int64_t c) {
  BatchNormOptions o;
  o.num_features = c;
  return std::make_shared<BatchNorm2d>(o);
}

// conv1, bn1, relu: registered by the model under torchvision's names, run as one block.
class Stem : public Module {
 public:
  Stem(std::shared_ptr<Conv2d> c, std::shared_ptr<BatchNorm2d> b)
      : conv1_(register_module("conv1", std::move(c))),
        bn1_(register_module("bn1", std::move(b))) {}
  Tensor forward(const Tensor& x) override { return relu(bn1_->forward(conv1_->forward(x))); }
  std::string type_name() const override { return "ResNetStem"; }

 private:
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
};

class Head : public Module {
 public:
  explicit Head(std::shared_ptr<Linear> f) : fc_(register_module("fc", std::move(f))) {}
  Tensor forward(const Tensor& x) override { return fc_->forward(global_avg_pool2d(x)); }
  std::string type_name() const override { return "ResNetHead"; }

 private:
  std::shared_ptr<Linear> fc_;
};

}  // namespace

BasicBlock::BasicBlock(std::int64_t in, std::int64_t out, int stride, Generator& gen) {
  conv1 = register_module("conv1", conv(in, out, 3, stride, gen));
  bn1 = register_module("bn1", bn(out));
  conv2 = register_module("conv2", conv(out, out, 3, 1, gen));
  bn2 = register_module("bn2", bn(out));
  if (stride != 1 || in != out) {
    downsample = register_module("downsample",
                                 std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
                                     conv(in, out, 1, stride, gen), bn(out)}));
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor h = relu(bn1->forward(conv1->forward(x)));
  h = bn2->forward(conv2->forward(h));
  return relu(add(h, downsample ? downsample->forward(x) : x));
}

ResNet::ResNet(const ResNetConfig& c, Generator& gen) : c_(c) {
  if (c.widths.empty() || c.widths.size() != c.blocks.size()) {
    throw std::invalid_argument("ResNet: widths and blocks must name the same number of stages (" +
                                std::to_string(c.widths.size()) + " and " +
                                std::to_string(c.blocks.size()) + ")");
  }
  for (std::size_t s = 0; s < c.widths.size(); ++s) {
    if (c.widths[s] <= 0 || c.blocks[s] <= 0) {
      throw std::invalid_argument("ResNet: stage " + std::to_string(s + 1) +
                                  " needs a positive width and block count");
    }
  }
  auto conv1 = register_module("conv1", conv(c.in_channels, c.widths[0], 3, 1, gen));
  auto bn1 = register_module("bn1", bn(c.widths[0]));
  blocks_.push_back(std::make_shared<Stem>(conv1, bn1));
  std::int64_t in = c.widths[0];
  for (std::size_t s = 0; s < c.widths.size(); ++s) {
    auto stage = register_module("layer" + std::to_string(s + 1), std::make_shared<Sequential>());
    for (std::int64_t i = 0; i < c.blocks[s]; ++i) {
      const int stride = (s > 0 && i == 0) ? 2 : 1;
      auto block = std::make_shared<BasicBlock>(in, c.widths[s], stride, gen);
      stage->push_back(block);
      blocks_.push_back(block);
      in = c.widths[s];
    }
  }
  auto fc = register_module("fc", std::make_shared<Linear>(in, c.num_classes, true, gen));
  blocks_.push_back(std::make_shared<Head>(fc));
}

Tensor ResNet::forward(const Tensor& x) {
  if (x.dim() != 4 || x.size(1) != c_.in_channels) {
    throw std::invalid_argument("ResNet: expected (N, " + std::to_string(c_.in_channels) +
                                ", H, W), got " + x.shape().str());
  }
  return forward_blocks(x);
}

std::string ResNet::extra_repr() const {
  std::string depth = "widths=[";
  for (std::size_t s = 0; s < c_.widths.size(); ++s)
    depth += (s ? ", " : "") + std::to_string(c_.widths[s]) + "x" + std::to_string(c_.blocks[s]);
  return depth + "], num_classes=" + std::to_string(c_.num_classes);
}

}  // namespace hpm::nn
