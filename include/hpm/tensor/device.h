// Device: a logical compute device. On this CPU-only system a Device is a group of kernel threads
// with a memory budget. Every tensor's storage comes from a Device, which counts current and peak
// bytes, keeps freed blocks for reuse (a caching allocator, as a GPU runtime would) and refuses an
// allocation past its budget with OutOfMemoryError, the CPU analogue of a GPU's OOM.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace hpm {

class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct MemoryStats {
  std::size_t current_bytes = 0;  // held by live tensors
  std::size_t peak_bytes = 0;     // high-water mark of current_bytes since the last reset_peak()
  std::size_t cached_bytes = 0;   // freed blocks kept for reuse
  std::size_t budget_bytes = 0;
  std::uint64_t allocations = 0;  // requests served
  std::uint64_t cache_hits = 0;   // requests served from the cache
};

class Device {
 public:
  static constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

  explicit Device(std::string name, std::size_t budget_bytes = kUnlimited, int threads = 1);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // The process-wide default device ("cpu"), unlimited unless set_budget is called.
  static Device& cpu();
  // Where the calling thread's new tensors go unless a device is named: cpu() unless a
  // DeviceGuard says otherwise. This is how a pipeline stage's thread keeps its activations
  // (and their accounting) on its own Device without every op taking a device argument.
  static Device& current();

  const std::string& name() const { return name_; }
  int threads() const { return threads_; }
  void set_threads(int threads);

  // Blocks are 64-byte aligned. Throws OutOfMemoryError naming the device, the request and the
  // budget when current + request would exceed the budget (after dropping the cache).
  void* allocate(std::size_t bytes);
  void deallocate(void* ptr, std::size_t bytes);

  MemoryStats stats() const;
  void set_budget(std::size_t bytes);
  void reset_peak();
  void empty_cache();

 private:
  static std::size_t round_up(std::size_t bytes) { return (bytes + 63) & ~std::size_t{63}; }
  void release_cache_locked();

  std::string name_;
  int threads_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  std::map<std::size_t, std::vector<void*>> free_blocks_;  // by rounded size
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
