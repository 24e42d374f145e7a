// "floats", "bytes", "I64": how error messages count a buffer's elements.
#pragma once
#include "hpm/tensor/dtype.h"

namespace hpm::comm {

inline const char* values_of(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "floats";
    case DType::U8:
      return "bytes";
    default:
      return dtype_name(dtype);
  }
}

}  // namespace hpm::comm
