#include "hpm/tensor/tensor.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "hpm/tensor/random.h"

namespace hpm {

Storage::Storage(Device& device, std::size_t bytes)
    : device_(&device), data_(device.allocate(bytes)), bytes_(bytes) {}

Storage::~Storage() { device_->deallocate(data_, bytes_); }

void Storage::move_to(Device& device) {
  if (&device == device_) return;
  void* moved = device.allocate(bytes_);
  std::memcpy(moved, data_, bytes_);
  device_->deallocate(data_, bytes_);
  device_ = &device;
  data_ = moved;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device& device) {
  for (auto d : shape.dims()) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape.str());
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(
      device, static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  impl->shape = shape;
  impl->dtype = dtype;
  AllocationLog::record(impl->storage);
  return Tensor(std::move(impl));
}

namespace {
thread_local AllocationLog* current_log = nullptr;
}  // namespace

AllocationLog::AllocationLog() : previous_(current_log) { current_log = this; }
AllocationLog::~AllocationLog() { current_log = previous_; }

void AllocationLog::record(const std::shared_ptr<Storage>& storage) {
  if (current_log != nullptr) current_log->entries_.push_back(storage);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device& device) {
  Tensor t = empty(shape, dtype, device);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, Device& device) {
  Tensor t = empty(shape, DType::F32, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from(std::span<const float> values, const Shape& shape, Device& device) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel()) {
    throw std::invalid_argument("Tensor::from: " + std::to_string(values.size()) +
                                " values for shape " + shape.str());
  }
  Tensor t = empty(shape, DType::F32, device);
  std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_i64(std::span<const std::int64_t> values, const Shape& shape, Device& device) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel()) {
    throw std::invalid_argument("Tensor::from_i64: " + std::to_string(values.size()) +
                                " values for shape " + shape.str());
  }
  Tensor t = empty(shape, DType::I64, device);
  std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, float mean, float stddev, Device& device) {
  Tensor t = empty(shape, DType::F32, device);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = mean + stddev * gen.normal();
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Generator& gen, float low, float high, Device& device) {
  Tensor t = empty(shape, DType::F32, device);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = low + (high - low) * gen.uniform();
  return t;
}

float Tensor::item() const {
  if (numel() != 1) {
    throw std::logic_error("item() needs a one-element tensor, got shape " + shape().str());
  }
  if (dtype() == DType::I64) return static_cast<float>(*data<std::int64_t>());
  return *data<float>();
}

std::vector<float> Tensor::to_vector() const {
  const float* p = data<float>();
  return std::vector<float>(p, p + numel());
}

std::vector<std::int64_t> Tensor::to_vector_i64() const {
  const std::int64_t* p = data<std::int64_t>();
  return std::vector<std::int64_t>(p, p + numel());
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  std::int64_t known = 1;
  for (int i = 0; i < s.rank(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) throw std::invalid_argument("reshape: more than one -1 in " + shape.str());
      infer = i;
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0) {
      throw std::invalid_argument("reshape: cannot view " + this->shape().str() + " as " +
                                  shape.str());
    }
    s[infer] = numel() / known;
  }
  if (s.numel() != numel()) {
    throw std::invalid_argument("reshape: cannot view " + this->shape().str() + " as " +
                                shape.str());
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = std::move(s);
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::narrow(std::int64_t begin, std::int64_t length) const {
  if (dim() == 0 || begin < 0 || length < 0 || begin + length > size(0)) {
    throw std::out_of_range("narrow(" + std::to_string(begin) + ", " + std::to_string(length) +
                            ") out of range for shape " + shape().str());
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset + begin * shape().numel_from(1);
  impl->shape = shape();
  impl->shape[0] = length;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::to(Device& device) const {
  if (&device == &this->device()) return *this;
  Tensor t = empty(shape(), dtype(), device);
  std::memcpy(t.raw_data(), raw_data(), nbytes());
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), device());
  std::memcpy(t.raw_data(), raw_data(), nbytes());
  return t;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

void Tensor::copy_(const Tensor& src) {
  if (src.numel() != numel() || src.dtype() != dtype()) {
    throw std::invalid_argument("copy_: source " + src.shape().str() + " " +
                                dtype_name(src.dtype()) + " does not match " + shape().str() + " " +
                                dtype_name(dtype()));
  }
  std::memmove(raw_data(), src.raw_data(), nbytes());
}

void Tensor::fill_(float value) {
  if (dtype() == DType::I64) {
    auto* p = data<std::int64_t>();
    for (std::int64_t i = 0; i < numel(); ++i) p[i] = static_cast<std::int64_t>(value);
    return;
  }
  float* p = data<float>();
  for (std::int64_t i = 0; i < numel(); ++i) p[i] = value;
}

void Tensor::zero_() { std::memset(raw_data(), 0, nbytes()); }

AutogradMeta& Tensor::autograd_meta() {
  if (!impl_->autograd) impl_->autograd = std::make_unique<AutogradMeta>();
  return *impl_->autograd;
}

Tensor& Tensor::set_requires_grad(bool on) {
  if (on && dtype() != DType::F32) {
    throw std::logic_error("only floating-point tensors can require gradients");
  }
  autograd_meta().requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  if (!impl_->autograd || !impl_->autograd->grad) return Tensor();
  return Tensor(impl_->autograd->grad);
}

void Tensor::set_grad(const Tensor& g) { autograd_meta().grad = g.impl_; }

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  return impl_->autograd ? impl_->autograd->grad_fn : none;
}

void Tensor::check_dtype(DType expected) const {
  if (impl_->dtype != expected) {
    throw std::logic_error(std::string("tensor of dtype ") + dtype_name(impl_->dtype) +
                           " accessed as " + dtype_name(expected));
  }
}

std::string Tensor::str(int max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << shape().str() << ", " << dtype_name(dtype()) << ", [";
  const std::int64_t n = std::min<std::int64_t>(numel(), max_elements);
  for (std::int64_t i = 0; i < n; ++i) {
    if (i) os << ", ";
    if (dtype() == DType::F32) os << data<float>()[i];
    if (dtype() == DType::I64) os << data<std::int64_t>()[i];
  }
  if (n < numel()) os << ", ...";
  os << "])";
  return os.str();
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  if (t.shape() != expected) {
    throw std::invalid_argument(std::string(what) + ": expected shape " + expected.str() +
                                ", got " + t.shape().str());
  }
}

}  // namespace hpm
