#include "hpm/tensor/shape.h"

#include <sstream>
#include <stdexcept>

#include "hpm/tensor/dtype.h"

namespace hpm {

int Shape::wrap(int i) const {
  const int r = rank();
  const int w = i < 0 ? i + r : i;
  if (w < 0 || w >= r) {
    throw std::out_of_range("dimension " + std::to_string(i) + " out of range for shape " + str());
  }
  return w;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
  os << ']';
  return os.str();
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> out(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int ia = a.rank() - r + i, ib = b.rank() - r + i;
    const std::int64_t da = ia >= 0 ? a.dims()[static_cast<std::size_t>(ia)] : 1;
    const std::int64_t db = ib >= 0 ? b.dims()[static_cast<std::size_t>(ib)] : 1;
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument("shapes " + a.str() + " and " + b.str() +
                                  " cannot be broadcast together");
    }
    out[static_cast<std::size_t>(i)] = da == 1 ? db : da;
  }
  return Shape(std::move(out));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::I64:
      return "I64";
    case DType::I32:
      return "I32";
    case DType::BF16:
      return "BF16";
    case DType::I8:
      return "I8";
    case DType::F16:
      return "F16";
    case DType::F64:
      return "F64";
    case DType::U8:
      return "U8";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  if (name == "F32") return DType::F32;
  if (name == "I64") return DType::I64;
  if (name == "I32") return DType::I32;
  if (name == "BF16") return DType::BF16;
  if (name == "I8") return DType::I8;
  if (name == "F16") return DType::F16;
  if (name == "F64") return DType::F64;
  if (name == "U8") return DType::U8;
  throw std::invalid_argument("unsupported dtype '" + name +
                              "' (hpm reads F32, F16, BF16, F64, I64, I32, I8, U8)");
}

}  // namespace hpm
