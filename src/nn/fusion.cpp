#include "hpm/nn/fusion.h"

#include "hpm/nn/layers.h"

namespace hpm::nn {

namespace {
template <typename T>
T* layer_as(std::span<const std::shared_ptr<Module>> next, std::size_t i) {
  return i < next.size() ? dynamic_cast<T*>(next[i].get()) : nullptr;
}
}  // namespace

const std::vector<FusionRule>& fusion_rules() {
  static const std::vector<FusionRule> rules = {
      [](std::span<const std::shared_ptr<Module>> next) -> std::optional<Fusion> {
        auto* conv = layer_as<Conv2d>(next, 0);
        auto* pool = layer_as<MaxPool2d>(next, 2);
        if (conv == nullptr || layer_as<ReLU>(next, 1) == nullptr || pool == nullptr) {
          return std::nullopt;
        }
        const kernels::Pool2dParams p = pool->params();
        return Fusion{3, [conv, p](const Tensor& x) { return conv->forward_relu_max_pool(x, p); }};
      },
      [](std::span<const std::shared_ptr<Module>> next) -> std::optional<Fusion> {
        auto* conv = layer_as<Conv2d>(next, 0);
        if (conv == nullptr || layer_as<ReLU>(next, 1) == nullptr) return std::nullopt;
        return Fusion{2, [conv](const Tensor& x) { return conv->forward_relu(x); }};
      },
  };
  return rules;
}

std::vector<Unit> plan_units(const std::vector<std::shared_ptr<Module>>& layers) {
  std::vector<Unit> units;
  for (std::size_t i = 0; i < layers.size();) {
    Unit u{i, i + 1, nullptr};
    const std::span<const std::shared_ptr<Module>> next(layers.data() + i, layers.size() - i);
    for (const FusionRule& rule : fusion_rules()) {
      if (auto fused = rule(next)) {
        u = {i, i + fused->layers, std::move(fused->forward)};
        break;
      }
    }
    i = u.end;
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace hpm::nn
