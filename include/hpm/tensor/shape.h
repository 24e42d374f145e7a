// Shape: the extents of a tensor, outermost first. Tensors are row-major contiguous.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace hpm {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(wrap(i))]; }
  std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(wrap(i))]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  // Elements spanned by dimensions [0, to) (not numel() / numel_from(to), which divides by zero
  // when a later dimension is empty).
  std::int64_t numel_before(int to) const {
    std::int64_t n = 1;
    for (int i = 0; i < to; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  // Elements spanned by dimensions [from, rank).
  std::int64_t numel_from(int from) const {
    std::int64_t n = 1;
    for (int i = from; i < rank(); ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  // Negative indices count from the end, as in PyTorch; throws std::out_of_range otherwise.
  int wrap(int i) const;
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::vector<std::int64_t>& dims() { return dims_; }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string str() const;  // "[2, 3]"

 private:
  std::vector<std::int64_t> dims_;
};

// The NumPy broadcast of two shapes; throws std::invalid_argument naming both if incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);

}  // namespace hpm
