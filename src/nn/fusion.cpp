#include "hpm/nn/fusion.h"

#include "hpm/nn/layers.h"

namespace hpm::nn {

const std::vector<FusionRule>& fusion_rules() {
  static const std::vector<FusionRule> rules = {
      [](Module& first, Module& second) -> std::optional<FusedForward> {
        auto* conv = dynamic_cast<Conv2d*>(&first);
        if (conv == nullptr || dynamic_cast<ReLU*>(&second) == nullptr) return std::nullopt;
        return FusedForward([conv](const Tensor& x) { return conv->forward_relu(x); });
      },
  };
  return rules;
}

std::vector<Unit> plan_units(const std::vector<std::shared_ptr<Module>>& layers) {
  std::vector<Unit> units;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Unit u{i, i + 1, nullptr};
    if (i + 1 < layers.size()) {
      for (const FusionRule& rule : fusion_rules()) {
        if (auto fused = rule(*layers[i], *layers[i + 1])) {
          u = {i, i + 2, std::move(*fused)};
          break;
        }
      }
    }
    i = u.end - 1;
    units.push_back(std::move(u));
  }
  return units;
}

}  // namespace hpm::nn
