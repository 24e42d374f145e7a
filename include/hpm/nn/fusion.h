// Fusion as a pass outside the module classes: rules that run adjacent layers of a Sequential as
// one op with identical results (a Conv2d followed by a ReLU runs as one convolution with a ReLU
// post-op, one pass less over the output; followed by a MaxPool2d too, the ReLU's backward pass
// disappears and the full-size output is not kept). Sequential::forward, recompute's segments and
// offload's groups all take their units from plan_units, so none of them, and not the Module base
// class, needs to know which layer types fuse.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "hpm/nn/module.h"

namespace hpm::nn {

// The layers a fusion covers, their forwards in turn, as one call.
using FusedForward = std::function<Tensor(const Tensor& x)>;
struct Fusion {
  std::size_t layers = 0;  // how many, from the first of `next`
  FusedForward forward;
};
// Whether the first layers of `next` fuse, and how to run them when they do.
using FusionRule =
    std::function<std::optional<Fusion>(std::span<const std::shared_ptr<Module>> next)>;

// The rules in force, in the order they are tried, longest first (built in: Conv2d, ReLU,
// MaxPool2d; then Conv2d, ReLU).
const std::vector<FusionRule>& fusion_rules();

// One step of a Sequential: layers [begin, end), run by `fused` when a rule matched, else
// (end = begin + 1) by the layer's own forward.
struct Unit {
  std::size_t begin = 0, end = 0;
  FusedForward fused;
};
std::vector<Unit> plan_units(const std::vector<std::shared_ptr<Module>>& layers);

}  // namespace hpm::nn
