// Where state that lives beside a tensor is allocated.
#pragma once
#include "hpm/tensor/tensor.h"

namespace hpm {

// Where a new tensor that lives beside `t` (optimizer state, running sums) is allocated: the
// current device when it has t's id, else t's device. On the CPU this is where such state always
// went (a pipeline stage's Device, which holds t while the stage runs, may be gone before the
// state is); on another device type it is t's device.
Device& device_beside(const Tensor& t);

}  // namespace hpm
