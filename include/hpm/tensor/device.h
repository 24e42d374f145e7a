// Device: where tensors live and ops run. A Device has an id (its type and index: "cpu",
// "cuda:0"), an Allocator (a memory budget, current and peak accounting, a cache of freed blocks)
// and a Stream its ops are issued to. Several logical Devices may share one id: a pipeline
// stage's own CPU Device keeps its activations' accounting apart from the others' although all are
// host memory. Tensors of different ids never meet in one op (an error naming both); those of one
// id do, whichever logical Device holds them.
#pragma once
#include <cstddef>
#include <limits>
#include <memory>
#include <string>

#include "hpm/tensor/allocator.h"
#include "hpm/tensor/device_id.h"
#include "hpm/tensor/stream.h"

namespace hpm {

class Device {
 public:
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

  // A logical CPU device.
  explicit Device(std::string name, std::size_t budget_bytes = kUnlimited, int threads = 1);
  // A device of any registered backend (backend.h), e.g. DeviceId{DeviceType::kCuda, 0}.
  Device(DeviceId id, std::string name, std::size_t budget_bytes = kUnlimited, int threads = 1);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // The process-wide default device ("cpu"), unlimited unless set_budget is called.
  static Device& cpu();
  // Host memory that tensors of a device are swapped out to (offload): a logical CPU device of its
  // own, so that what is parked there is counted apart from what computes (a GPU's runtime would
  // hand out pinned memory here).
  static Device& host();
  // Where the calling thread's new tensors go unless a device is named: cpu() unless a
  // DeviceGuard says otherwise. This is how a pipeline stage's thread keeps its activations
  // (and their accounting) on its own Device without every op taking a device argument; an op
  // allocates its outputs on its inputs' device.
  static Device& current();

  DeviceId id() const { return id_; }
  const std::string& name() const { return name_; }
  // Whether the host may read and write its memory directly (Tensor::data).
  bool is_host() const { return is_host_; }
  Stream& stream() const { return *stream_; }
  int threads() const { return threads_; }
  void set_threads(int threads);

  void* allocate(std::size_t bytes) { return allocator_.allocate(bytes); }
  void deallocate(void* ptr, std::size_t bytes) { allocator_.deallocate(ptr, bytes); }
  Allocator& allocator() { return allocator_; }

  MemoryStats stats() const { return allocator_.stats(); }
  void set_budget(std::size_t bytes) { allocator_.set_budget(bytes); }
  void reset_peak() { allocator_.reset_peak(); }
  void empty_cache() { allocator_.empty_cache(); }

 private:
  DeviceId id_;
  std::string name_;
  int threads_;
  bool is_host_;
  Allocator allocator_;
  std::unique_ptr<Stream> stream_;
};

// Makes `device` the calling thread's current device for the guard's lifetime (nests).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device& device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  Device* previous_;
};

// Sets the intra-op thread count of kernels (OpenMP, hence oneDNN) for the calling thread.
void set_num_threads(int threads);
int num_threads();

}  // namespace hpm
