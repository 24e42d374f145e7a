// Internal to the data layer: stacking elements along a new first dimension.
#pragma once
#include <vector>

#include "hpm/data/dataset.h"

namespace hpm::data {

// Component c of every element, stacked; padded to the largest shape with pad_value when `pad`,
// else every shape must agree (DataError from `stage` otherwise).
Tensor stack_component(const std::vector<Element>& items, std::size_t c, bool pad, float pad_value,
                       const char* stage);
Element stack_elements(const std::vector<Element>& items, bool pad, float pad_value, const char* stage);

}  // namespace hpm::data
