// A GPU's memory and streams behind the tensor layer's interfaces (allocator.h, stream.h).
#pragma once
#include <memory>

#include "hpm/tensor/allocator.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/stream.h"

namespace hpm::cuda {

// cudaMalloc'd global memory of one device. The Allocator above it caches freed blocks by size
// class, so the steady state of training calls neither cudaMalloc nor cudaFree. Every op of a
// device runs on its one compute stream, so a block freed by one op and handed to the next is
// used in stream order: no event is needed between them.
class DeviceMemory final : public MemoryResource {
 public:
  explicit DeviceMemory(int index) : index_(index) {}
  void* allocate(std::size_t bytes) override;
  void free(void* ptr, std::size_t bytes) override;
  // 512-byte granules below 1 MiB; above, 16 classes per power of two (at most 6% unused).
  std::size_t round_size(std::size_t bytes) const override;
  void fill(void* ptr, std::size_t bytes, unsigned char byte) override;

 private:
  int index_;
};

std::unique_ptr<Stream> make_compute_stream(DeviceId id);

// Copies between the host and a GPU, or two GPUs, ordered after the work issued to the device's
// compute stream; returns once `src` may be reused.
void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                std::size_t bytes);

}  // namespace hpm::cuda
