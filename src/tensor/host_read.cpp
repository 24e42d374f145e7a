#include "hpm/tensor/host_read.h"

#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace hpm {

namespace {

// The default read: copies made now, which a device that runs ops as they are issued (the CPU)
// has nothing to wait for.
class CopiedRead final : public PendingRead {
 public:
  explicit CopiedRead(const std::vector<Tensor>& values) {
    host_.reserve(values.size());
    for (const Tensor& v : values) {
      Tensor h = Tensor::empty(v.shape(), v.dtype(), Device::cpu());
      h.copy_(v);
      host_.push_back(std::move(h));
    }
  }
  std::vector<Tensor> wait() override { return std::move(host_); }

 private:
  std::vector<Tensor> host_;
};

}  // namespace

std::unique_ptr<PendingRead> Backend::begin_read(const std::vector<Tensor>& values) {
  return std::make_unique<CopiedRead>(values);
}

HostRead::HostRead(const std::vector<Tensor>& values) : count_(values.size()) {
  if (values.empty()) return;
  for (const Tensor& v : values) {
    if (!v.defined()) throw std::invalid_argument("HostRead: an undefined tensor");
    if (v.device().id() != values.front().device().id()) {
      throw std::invalid_argument("HostRead: tensors on " + values.front().device().id().str() +
                                  " and " + v.device().id().str() + " in one read");
    }
  }
  pending_ = backend(values.front().device().id().type).begin_read(values);
  ops_at_begin_ = detail::ops_begun_on_this_thread();
}

HostRead::HostRead(HostRead&&) noexcept = default;
HostRead& HostRead::operator=(HostRead&&) noexcept = default;
HostRead::~HostRead() = default;

const std::vector<Tensor>& HostRead::wait() {
  if (failure_) std::rethrow_exception(failure_);
  if (!pending_) return host_;
  // Nothing issued since the read began: this wait is for everything, as item()'s.
  if (detail::ops_begun_on_this_thread() == ops_at_begin_) detail::note_host_read();
  std::unique_ptr<PendingRead> pending = std::move(pending_);
  try {
    host_ = pending->wait();
  } catch (...) {
    failure_ = std::current_exception();  // each later wait says it again
    throw;
  }
  return host_;
}

double HostRead::value(std::size_t i, std::int64_t at) {
  const Tensor& h = wait().at(i);
  if (at < 0 || at >= h.numel()) {
    throw std::out_of_range("HostRead::value: element " + std::to_string(at) + " of " +
                            std::to_string(h.numel()));
  }
  switch (h.dtype()) {
    case DType::F32:
      return h.data<float>()[at];
    case DType::F64:
      return h.data<double>()[at];
    case DType::I64:
      return static_cast<double>(h.data<std::int64_t>()[at]);
    case DType::I32:
      return h.data<std::int32_t>()[at];
    default:
      throw std::invalid_argument(std::string("HostRead::value: a ") + dtype_name(h.dtype()) +
                                  " value");
  }
}

}  // namespace hpm
