// Allocator: a device's memory, with a budget, current and peak accounting and a cache of freed
// blocks (a caching allocator, as GPU runtimes have), over the raw memory a backend provides.
// Running past the budget is an OutOfMemoryError naming the device, the request and the budget:
// for the CPU the analogue of a GPU's OOM, for a GPU its own.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
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

// Raw memory of one device: host memory, a GPU's global memory. Blocks are 64-byte aligned.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // nullptr when the device has no more.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void free(void* ptr, std::size_t bytes) = 0;
  // The size class a request is served from (and cached under): a multiple of 64 bytes.
  virtual std::size_t round_size(std::size_t bytes) const {
    return (bytes + 63) & ~std::size_t{63};
  }
  // Sets `bytes` bytes at ptr to `byte` (poisoning, below), ordered with the device's work.
  virtual void fill(void* ptr, std::size_t bytes, unsigned char byte);
};

// Host memory from aligned_alloc.
class HostMemory final : public MemoryResource {
 public:
  void* allocate(std::size_t bytes) override;
  void free(void* ptr, std::size_t bytes) override;
};

class Allocator {
 public:
  Allocator(std::string device_name, std::shared_ptr<MemoryResource> memory,
            std::size_t budget_bytes);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Throws OutOfMemoryError when current + request would exceed the budget (after dropping the
  // cache) or the device has no more memory.
  void* allocate(std::size_t bytes);
  void deallocate(void* ptr, std::size_t bytes);

  MemoryStats stats() const;
  void set_budget(std::size_t bytes);
  void reset_peak();
  void empty_cache();

  // While on (every Allocator of the process), each block handed out is first filled with 0xFF
  // bytes (NaN in every float type), so that a kernel leaving an element of its output unwritten
  // fails a comparison instead of passing on a stale value; the conformance tests turn it on.
  static void set_poison(bool on);

 private:
  void release_cache_locked();

  std::string device_name_;
  std::shared_ptr<MemoryResource> memory_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  std::map<std::size_t, std::vector<void*>> free_blocks_;  // by rounded size
};

}  // namespace hpm
