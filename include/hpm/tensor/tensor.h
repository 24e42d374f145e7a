// Tensor: a shared handle to a typed, row-major, contiguous block of a Device's memory.
// data<T>() is the explicit host view: it throws for a tensor whose device the host cannot read
// (a GPU's); code above the tensor layer goes through ops (kernels.h) instead, and item() or
// to_vector() bring values to the host.
//
// Copies of a Tensor alias the same data (like torch.Tensor). Views (reshape, narrow along the
// first dimension) share storage with an element offset; everything else allocates. The autograd
// fields are plain data here: the autograd layer gives them meaning, so the tensor layer can be
// used and tested alone.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hpm/tensor/device.h"
#include "hpm/tensor/dtype.h"
#include "hpm/tensor/shape.h"

namespace hpm {

namespace autograd {
class Node;
}
class Generator;
class Tensor;

// Owns one allocation of a Device and returns it there when the last view dies.
class Storage {
 public:
  Storage(Device& device, std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device& device() const { return *device_; }
  // Moves the bytes to `device` and frees them on the old one; every view of this storage follows
  // (parameters placed on a pipeline stage's Device; activations swapped to host memory and
  // back). Nobody may touch the data while it moves. Throws OutOfMemoryError, changing nothing.
  void move_to(Device& device);

 private:
  Device* device_;
  void* data_;
  std::size_t bytes_;
};

// While alive, records every Storage the calling thread creates (weakly: it keeps none alive).
// Offload uses it to learn which storages a layer's forward allocated; logs nest.
class AllocationLog {
 public:
  AllocationLog();
  ~AllocationLog();
  AllocationLog(const AllocationLog&) = delete;
  AllocationLog& operator=(const AllocationLog&) = delete;
  // What was recorded since the last take(), in allocation order.
  std::vector<std::weak_ptr<Storage>> take() { return std::exchange(entries_, {}); }
  // Tensor::empty's hook (the innermost log of the calling thread).
  static void record(const std::shared_ptr<Storage>& storage);

 private:
  AllocationLog* previous_;
  std::vector<std::weak_ptr<Storage>> entries_;
};

struct TensorImpl;

// Per-tensor autograd state. grad_fn is the node that produced this tensor (null for leaves);
// grad_accumulator is the leaf's sink node, created on first use and shared by all graphs.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  std::weak_ptr<autograd::Node> grad_accumulator;
  int output_nr = 0;
  // Called after a leaf's gradient is accumulated (the gradient reducer starts all-reduce here).
  std::vector<std::function<void(Tensor&)>> post_accumulate_hooks;
  // Set for a leaf whose gradient several threads accumulate into at once (a tied weight used by
  // two pipeline stages): every accumulation then goes through the leaf's accumulator under this
  // lock, never straight into .grad from a kernel.
  std::shared_ptr<std::mutex> accumulate_lock;
  // .grad is a reused buffer (a slot of the gradient reducer's bucket) whose contents are stale:
  // the next accumulation copies into it instead of adding, and clears this.
  bool grad_is_stale = false;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::F32;
  std::unique_ptr<AutogradMeta> autograd;  // allocated only for tensors that take part in autograd
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // -- factories ----------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::F32,
                      Device& device = Device::current());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32,
                      Device& device = Device::current());
  static Tensor full(const Shape& shape, float value, Device& device = Device::current());
  static Tensor ones(const Shape& shape, Device& device = Device::current()) {
    return full(shape, 1.0f, device);
  }
  static Tensor scalar(float value) { return full(Shape{}, value); }
  static Tensor from(std::span<const float> values, const Shape& shape,
                     Device& device = Device::current());
  static Tensor from(std::initializer_list<float> values, const Shape& shape) {
    return from(std::span<const float>(values.begin(), values.size()), shape);
  }
  static Tensor from_i64(std::span<const std::int64_t> values, const Shape& shape,
                         Device& device = Device::current());
  // A 1-D U8 tensor of these bytes (control messages between ranks: names, descriptions).
  static Tensor from_bytes(std::string_view bytes, Device& device = Device::current());
  // A tensor of `shape` and `dtype` holding these bytes (a message's payload); throws
  // std::invalid_argument when their number does not fit.
  static Tensor from_bytes(std::string_view bytes, const Shape& shape, DType dtype,
                           Device& device = Device::current());
  static Tensor randn(const Shape& shape, Generator& gen, float mean = 0.0f, float stddev = 1.0f,
                      Device& device = Device::current());
  static Tensor uniform(const Shape& shape, Generator& gen, float low, float high,
                        Device& device = Device::current());

  // -- metadata -----------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int dim() const { return impl_->shape.rank(); }
  std::int64_t size(int d) const { return impl_->shape[d]; }
  std::int64_t numel() const { return impl_->shape.numel(); }
  DType dtype() const { return impl_->dtype; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype()); }
  Device& device() const { return impl_->storage->device(); }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same_storage(const Tensor& o) const { return impl_->storage == o.impl_->storage; }

  // -- data ---------------------------------------------------------------------------------
  // Checks the dtype (throws std::logic_error on a mismatch).
  template <typename T>
  T* data() const {
    check_dtype(dtype_of<T>::value);
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const {
    if (!impl_->storage->device().is_host()) throw_not_host();
    return static_cast<char*>(impl_->storage->data()) +
           impl_->offset * static_cast<std::int64_t>(dtype_size(impl_->dtype));
  }
  // The value of a one-element tensor (F32, F64, I64 or I32) as T (float or double): the one place
  // the host waits for a device's work.
  template <typename T = float>
  T item() const;
  std::vector<float> to_vector() const;
  std::vector<std::int64_t> to_vector_i64() const;
  // The bytes of the elements, on the host (any dtype).
  std::string to_bytes() const;
  // Overwrites the elements with these bytes (exactly nbytes() of them).
  void assign_bytes(std::string_view bytes);

  // -- views and copies (no autograd; the autograd layer's ops record these) ------------------
  Tensor reshape(const Shape& shape) const;                      // a view; one dimension may be -1
  Tensor narrow(std::int64_t begin, std::int64_t length) const;  // rows [begin, begin+length)
  // A 1-D U8 view of this tensor's bytes (same storage): how tensors of several dtypes share one
  // flat message.
  Tensor bytes_view() const;
  Tensor clone() const;
  // A copy on `device` (ops allocate where their inputs live, so this is how data enters a
  // pipeline stage's Device); this tensor itself when it is already there.
  Tensor to(Device& device) const;
  Tensor detach() const;          // shares data, no autograd history
  void copy_(const Tensor& src);  // same numel and dtype
  void fill_(float value);
  void zero_();

  // -- autograd state -----------------------------------------------------------------------
  bool requires_grad() const { return impl_->autograd && impl_->autograd->requires_grad; }
  Tensor& set_requires_grad(bool on);
  Tensor grad() const;
  void set_grad(const Tensor& g);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const { return !grad_fn(); }
  AutogradMeta& autograd_meta();  // creates it on first use
  // Runs reverse-mode differentiation from this tensor (defined in the autograd layer).
  void backward(const Tensor& grad_output = Tensor()) const;

  std::string str(int max_elements = 8) const;

 private:
  void check_dtype(DType expected) const;
  [[noreturn]] void throw_not_host() const;
  // This tensor itself on the host, or a host copy of it.
  Tensor on_host() const;
  std::shared_ptr<TensorImpl> impl_;
};

// Throws std::invalid_argument "<what>: expected shape X, got Y" on a mismatch.
void check_shape(const Tensor& t, const Shape& expected, const char* what);

// How many times the calling thread read tensor values on the host (item, to_vector, to_bytes,
// str) with ops issued since its previous read: on a device that runs asynchronously, each such
// read waits for the device to finish that work (a second read in a row finds it done). Counted
// whatever device the tensors are on, so that a CPU test can see how often a GPU step would wait.
// A backend's own reads inside an op (the CPU's kernels read scalars) are not counted.
std::uint64_t host_waits_on_this_thread();
namespace detail {
void note_op_begin();  // dispatch brackets every op with these
void note_op_end();
// How many ops the calling thread has begun; and the count of a host read that waited for every
// op issued so far (HostRead's, when nothing followed it).
std::uint64_t ops_begun_on_this_thread();
void note_host_read();
}  // namespace detail

}  // namespace hpm
