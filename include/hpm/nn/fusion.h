// Fusion as a pass outside the module classes: rules that run two adjacent layers of a
// Sequential as one op (a Conv2d followed by a ReLU runs as one convolution with a ReLU
// post-op: identical results, one pass less over the output). Sequential::forward, recompute's
// segments and offload's groups all take their units from plan_units, so none of them, and not
// the Module base class, needs to know which layer types fuse.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hpm/nn/module.h"

namespace hpm::nn {

// first.forward then second.forward, as one call.
using FusedForward = std::function<Tensor(const Tensor& x)>;
// Whether `first` followed by `second` fuse, and how to run them when they do.
using FusionRule = std::function<std::optional<FusedForward>(Module& first, Module& second)>;

// The rules in force, in the order they are tried (built in: Conv2d then ReLU).
const std::vector<FusionRule>& fusion_rules();

// One step of a Sequential: layers [begin, end), run by `fused` when a rule matched (end =
// begin + 2), else by the layer's own forward.
struct Unit {
  std::size_t begin = 0, end = 0;
  FusedForward fused;
};
std::vector<Unit> plan_units(const std::vector<std::shared_ptr<Module>>& layers);

}  // namespace hpm::nn
