// A GPU's memory, streams and copies.
#include "tensor/backend/cuda/device_memory.h"

#include <algorithm>
#include <cstring>

#include "hpm/tensor/device.h"
#include "tensor/backend/cuda/deferred_checks.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

void* DeviceMemory::allocate(std::size_t bytes) {
  Context& c = context(index_);
  HPM_CUDA_CHECK(cudaSetDevice(c.index));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: the Allocator drops its cache and tries again
    return nullptr;
  }
  HPM_CUDA_CHECK(e);
  return p;
}

void DeviceMemory::free(void* ptr, std::size_t) {
  // cudaFree waits for the device: only the cache's release (empty_cache, a budget squeeze) gets
  // here, never a step's steady state.
  HPM_CUDA_CHECK(cudaSetDevice(index_));
  HPM_CUDA_CHECK(cudaFree(ptr));
}

std::size_t DeviceMemory::round_size(std::size_t bytes) const {
  constexpr std::size_t kSmall = std::size_t{1} << 20;
  if (bytes <= kSmall) return (bytes + 511) & ~std::size_t{511};
  std::size_t octave = kSmall;
  while (octave * 2 < bytes) octave *= 2;
  const std::size_t step = octave / 16;
  return (bytes + step - 1) / step * step;
}

namespace {

// The calling thread's current device is `index` while this lives (an event belongs to the device
// current at its creation and must be recorded on a stream of that device; the runtime's calls
// act on the current device), and what it was afterwards.
class OnDevice {
 public:
  explicit OnDevice(int index) {
    HPM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) HPM_CUDA_CHECK(cudaSetDevice(index));
  }
  ~OnDevice() { (void)cudaSetDevice(previous_); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

void DeviceMemory::fill(void* ptr, std::size_t bytes, unsigned char byte) {
  Context& c = context(index_);
  const OnDevice on(index_);
  HPM_CUDA_CHECK(cudaMemsetAsync(ptr, byte, bytes, c.compute));
}

namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(int device, cudaStream_t stream, bool timed) {
    const OnDevice on(device);
    HPM_CUDA_CHECK(
        cudaEventCreateWithFlags(&event_, timed ? cudaEventDefault : cudaEventDisableTiming));
    HPM_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~CudaEvent() override { (void)cudaEventDestroy(event_); }
  void synchronize() override { HPM_CUDA_CHECK(cudaEventSynchronize(event_)); }
  bool ready() const override {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    HPM_CUDA_CHECK(e);
    return true;
  }
  double seconds_since(const Event& earlier) const override {
    const auto* e = dynamic_cast<const CudaEvent*>(&earlier);
    if (e == nullptr) return Event::seconds_since(earlier);
    float ms = 0;
    // cudaErrorInvalidResourceHandle: one of the two was recorded without timing.
    const cudaError_t status = cudaEventElapsedTime(&ms, e->event_, event_);
    if (status == cudaErrorInvalidResourceHandle) {
      (void)cudaGetLastError();
      return Event::seconds_since(earlier);
    }
    HPM_CUDA_CHECK(status);
    return static_cast<double>(ms) * 1e-3;
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CudaStream final : public Stream {
 public:
  explicit CudaStream(DeviceId id) : id_(id), stream_(context(id.index).compute) {}
  DeviceId device() const override { return id_; }
  void synchronize() override { HPM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  std::shared_ptr<Event> record() override {
    return std::make_shared<CudaEvent>(id_.index, stream_, false);
  }
  std::shared_ptr<Event> record_timed() override {
    return std::make_shared<CudaEvent>(id_.index, stream_, true);
  }
  void wait(const Event& event) override {
    const auto* e = dynamic_cast<const CudaEvent*>(&event);
    if (e == nullptr) return;  // another device type's events are complete when recorded
    HPM_CUDA_CHECK(cudaStreamWaitEvent(stream_, e->get(), 0));
  }

 private:
  DeviceId id_;
  cudaStream_t stream_;
};

// Host -> device through the pinned slots: the memcpy into one slot overlaps the DMA out of the
// other; a slot is refilled only after its last transfer finished.
void host_to_device(Context& c, void* dst, const void* src, std::size_t bytes) {
  std::lock_guard lock(c.staging_mu);
  if (bytes <= Context::kSmallBytes) {
    const int slot = c.small_next;
    c.small_next = (slot + 1) % Context::kSmallSlots;
    // An event never recorded is complete: the ring's first round waits for nothing.
    HPM_CUDA_CHECK(cudaEventSynchronize(c.small_done[slot]));
    void* staged =
        static_cast<char*>(c.small) + static_cast<std::size_t>(slot) * Context::kSmallBytes;
    std::memcpy(staged, src, bytes);
    HPM_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, c.compute));
    HPM_CUDA_CHECK(cudaEventRecord(c.small_done[slot], c.compute));
    return;
  }
  int slot = 0;
  for (std::size_t done = 0; done < bytes; slot ^= 1) {
    const std::size_t n = std::min(bytes - done, Context::kStagingBytes);
    HPM_CUDA_CHECK(cudaEventSynchronize(c.staging_done[slot]));
    std::memcpy(c.staging[slot], static_cast<const char*>(src) + done, n);
    HPM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + done, c.staging[slot], n,
                                   cudaMemcpyHostToDevice, c.compute));
    HPM_CUDA_CHECK(cudaEventRecord(c.staging_done[slot], c.compute));
    done += n;
  }
}

// Device -> host: the DMA into one slot overlaps the memcpy out of the other.
void device_to_host(Context& c, void* dst, const void* src, std::size_t bytes) {
  std::lock_guard lock(c.staging_mu);
  std::size_t pending_at = 0, pending_n = 0;
  int slot = 0, pending_slot = 0;
  for (std::size_t done = 0; done < bytes || pending_n > 0; slot ^= 1) {
    std::size_t n = 0;
    if (done < bytes) {
      n = std::min(bytes - done, Context::kStagingBytes);
      HPM_CUDA_CHECK(cudaMemcpyAsync(c.staging[slot], static_cast<const char*>(src) + done, n,
                                     cudaMemcpyDeviceToHost, c.compute));
      HPM_CUDA_CHECK(cudaEventRecord(c.staging_done[slot], c.compute));
    }
    if (pending_n > 0) {
      HPM_CUDA_CHECK(cudaEventSynchronize(c.staging_done[pending_slot]));
      std::memcpy(static_cast<char*>(dst) + pending_at, c.staging[pending_slot], pending_n);
    }
    pending_at = done;
    pending_n = n;
    pending_slot = slot;
    done += n;
  }
}

}  // namespace

std::unique_ptr<Stream> make_compute_stream(DeviceId id) {
  return std::make_unique<CudaStream>(id);
}

void copy_bytes(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                std::size_t bytes) {
  if (bytes == 0) return;
  const bool dst_gpu = dst_device.id().type == DeviceType::kCuda;
  const bool src_gpu = src_device.id().type == DeviceType::kCuda;
  if (dst_gpu && src_gpu) {
    Context& to = context(dst_device.id().index);
    Context& from = context(src_device.id().index);
    if (&to != &from) {
      // Another GPU: its pending work first, then a peer copy on the destination's stream. The
      // source's stream then waits for the copy: the caller may free `src` on return (a moved
      // storage does), and the source device's allocator hands a freed block to its next op in
      // its own stream's order, which without the wait could overwrite it before the copy reads.
      HPM_CUDA_CHECK(cudaStreamSynchronize(from.compute));
      HPM_CUDA_CHECK(cudaSetDevice(to.index));  // the event's device must be its stream's
      HPM_CUDA_CHECK(cudaMemcpyPeerAsync(dst, to.index, src, from.index, bytes, to.compute));
      cudaEvent_t copied = nullptr;
      HPM_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
      const cudaError_t recorded = cudaEventRecord(copied, to.compute);
      const cudaError_t waited =
          recorded == cudaSuccess ? cudaStreamWaitEvent(from.compute, copied, 0) : recorded;
      cudaEventDestroy(copied);  // released once it completes
      HPM_CUDA_CHECK(waited);
      return;
    }
    HPM_CUDA_CHECK(cudaSetDevice(to.index));
    HPM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, to.compute));
    return;
  }
  if (dst_gpu) {
    Context& c = context(dst_device.id().index);
    HPM_CUDA_CHECK(cudaSetDevice(c.index));
    host_to_device(c, dst, src, bytes);
    return;
  }
  Context& c = context(src_device.id().index);
  HPM_CUDA_CHECK(cudaSetDevice(c.index));
  device_to_host(c, dst, src, bytes);
  // The device has finished everything issued before this copy: the checks it owes the host.
  raise_failed_checks(c);
}

}  // namespace hpm::cuda
