#include "hpm/tensor/tensor.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

#include "hpm/tensor/backend.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/op_profile.h"
#include "hpm/tensor/placement.h"
#include "hpm/tensor/random.h"

namespace hpm {

namespace {
// Host to host is a memmove; anything else is the business of the backend of the device that is
// not the host's.
void copy_bytes(void* dst, Device& to, const void* src, Device& from, std::size_t bytes) {
  if (to.is_host() && from.is_host()) {
    std::memmove(dst, src, bytes);
    return;
  }
  const DeviceType type = to.id().type != DeviceType::kCpu ? to.id().type : from.id().type;
  backend(type).copy_bytes(dst, to, src, from, bytes);
}
}  // namespace

Storage::Storage(Device& device, std::size_t bytes)
    : device_(&device), data_(device.allocate(bytes)), bytes_(bytes) {}

Storage::~Storage() { device_->deallocate(data_, bytes_); }

void Storage::move_to(Device& device) {
  if (&device == device_) return;
  void* moved = device.allocate(bytes_);
  copy_bytes(moved, device, data_, *device_, bytes_);
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
  kernels::fill_(t, 0.0f);
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
  if (!device.is_host()) return from(values, shape, Device::cpu()).to(device);
  Tensor t = empty(shape, DType::F32, device);
  // An empty span's data() may be null, which memcpy may not be given even for no bytes.
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_i64(std::span<const std::int64_t> values, const Shape& shape, Device& device) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel()) {
    throw std::invalid_argument("Tensor::from_i64: " + std::to_string(values.size()) +
                                " values for shape " + shape.str());
  }
  if (!device.is_host()) return from_i64(values, shape, Device::cpu()).to(device);
  Tensor t = empty(shape, DType::I64, device);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_bytes(std::string_view bytes, Device& device) {
  const auto n = static_cast<std::int64_t>(bytes.size());
  if (!device.is_host()) return from_bytes(bytes, Device::cpu()).to(device);
  Tensor t = empty(Shape{n}, DType::U8, device);
  if (n > 0) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

Tensor Tensor::from_bytes(std::string_view bytes, const Shape& shape, DType dtype, Device& device) {
  Tensor t = empty(shape, dtype, device);
  t.assign_bytes(bytes);
  return t;
}

Tensor Tensor::randn(const Shape& shape, Generator& gen, float mean, float stddev, Device& device) {
  // The generator is the host's: draw there, in the same order on every device.
  if (!device.is_host()) return randn(shape, gen, mean, stddev, Device::cpu()).to(device);
  Tensor t = empty(shape, DType::F32, device);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = mean + stddev * gen.normal();
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Generator& gen, float low, float high, Device& device) {
  if (!device.is_host()) return uniform(shape, gen, low, high, Device::cpu()).to(device);
  Tensor t = empty(shape, DType::F32, device);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = low + (high - low) * gen.uniform();
  return t;
}

namespace {
thread_local bool work_issued = false;
thread_local int op_depth = 0;
thread_local std::uint64_t host_waits = 0;
thread_local std::uint64_t ops_begun = 0;
}  // namespace

void detail::note_op_begin() {
  work_issued = true;
  ++op_depth;
  ++ops_begun;
}

std::uint64_t detail::ops_begun_on_this_thread() { return ops_begun; }

void detail::note_host_read() {
  if (work_issued && op_depth == 0) {
    ++host_waits;
    work_issued = false;
  }
}

void detail::note_op_end() { --op_depth; }

std::uint64_t host_waits_on_this_thread() { return host_waits; }

Tensor Tensor::on_host() const {
  detail::note_host_read();
  return device().is_host() ? *this : to(Device::cpu());
}

template <typename T>
T Tensor::item() const {
  if (numel() != 1) {
    throw std::logic_error("item() needs a one-element tensor, got shape " + shape().str());
  }
  const Tensor h = on_host();
  if (dtype() == DType::I64) return static_cast<T>(*h.data<std::int64_t>());
  if (dtype() == DType::F64) return static_cast<T>(*h.data<double>());
  if (dtype() == DType::I32) return static_cast<T>(*h.data<std::int32_t>());
  return static_cast<T>(*h.data<float>());
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;

std::vector<float> Tensor::to_vector() const {
  const Tensor h = on_host();
  const float* p = h.data<float>();
  return std::vector<float>(p, p + numel());
}

std::vector<std::int64_t> Tensor::to_vector_i64() const {
  const Tensor h = on_host();
  const std::int64_t* p = h.data<std::int64_t>();
  return std::vector<std::int64_t>(p, p + numel());
}

std::string Tensor::to_bytes() const {
  const Tensor h = on_host();
  return std::string(static_cast<const char*>(h.raw_data()), nbytes());
}

void Tensor::assign_bytes(std::string_view bytes) {
  if (bytes.size() != nbytes()) {
    throw std::invalid_argument("assign_bytes: " + std::to_string(bytes.size()) +
                                " bytes for a tensor of " + std::to_string(nbytes()) + " (" +
                                shape().str() + " " + dtype_name(dtype()) + ")");
  }
  if (bytes.empty()) return;
  if (device().is_host()) {
    std::memcpy(raw_data(), bytes.data(), bytes.size());
  } else {
    copy_(from_bytes(bytes, shape(), dtype(), Device::cpu()));
  }
}

Tensor Tensor::bytes_view() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset * static_cast<std::int64_t>(dtype_size(impl_->dtype));
  impl->shape = Shape{static_cast<std::int64_t>(nbytes())};
  impl->dtype = DType::U8;
  return Tensor(std::move(impl));
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
  t.copy_(*this);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), device());
  t.copy_(*this);
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
  const auto at = [](const Tensor& t) {
    return static_cast<char*>(t.impl_->storage->data()) +
           t.impl_->offset * static_cast<std::int64_t>(dtype_size(t.impl_->dtype));
  };
  Device& to = device();
  Device& from = src.device();
  if (to.is_host() && from.is_host()) {
    copy_bytes(at(*this), to, at(src), from, nbytes());
    return;
  }
  // Timed on the device's stream (the destination's when both are devices).
  const op_profile::Scope profile(
      !to.is_host() ? (!from.is_host() ? "copy device to device" : "copy to device")
                    : "copy to host",
      dtype(), !to.is_host() ? to : from);
  copy_bytes(at(*this), to, at(src), from, nbytes());
}

void Tensor::fill_(float value) { kernels::fill_(*this, value); }

void Tensor::zero_() { kernels::fill_(*this, 0.0f); }

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

void Tensor::throw_not_host() const {
  throw std::logic_error(
      "a tensor on " + device().id().str() + " ('" + device().name() +
      "') was read as host memory: bring it to the host with .to(Device::cpu()), "
      "item() or to_vector()");
}

std::string Tensor::str(int max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  if (!device().is_host()) return on_host().str(max_elements) + " on " + device().id().str();
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

Device& device_beside(const Tensor& t) {
  Device& current = Device::current();
  return t.device().id() == current.id() ? current : t.device();
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  if (t.shape() != expected) {
    throw std::invalid_argument(std::string(what) + ": expected shape " + expected.str() +
                                ", got " + t.shape().str());
  }
}

}  // namespace hpm
