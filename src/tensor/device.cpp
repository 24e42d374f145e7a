#include "hpm/tensor/device.h"

#include <omp.h>

#include <cstdlib>
#include <sstream>

namespace hpm {

namespace {
std::string mib(std::size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return os.str();
}
}  // namespace

Device::Device(std::string name, std::size_t budget_bytes, int threads)
    : name_(std::move(name)), threads_(threads) {
  stats_.budget_bytes = budget_bytes;
}

Device::~Device() {
  std::lock_guard lock(mu_);
  release_cache_locked();
}

Device& Device::cpu() {
  // Leaked on purpose: tensors in static storage may outlive any other static.
  static Device* device = new Device("cpu", kUnlimited, 1);
  return *device;
}

namespace {
thread_local Device* current_device = nullptr;
}  // namespace

Device& Device::current() { return current_device != nullptr ? *current_device : cpu(); }

DeviceGuard::DeviceGuard(Device& device) : previous_(current_device) { current_device = &device; }
DeviceGuard::~DeviceGuard() { current_device = previous_; }

void Device::set_threads(int threads) { threads_ = threads < 1 ? 1 : threads; }

void* Device::allocate(std::size_t bytes) {
  const std::size_t size = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard lock(mu_);
  ++stats_.allocations;
  if (stats_.current_bytes + size > stats_.budget_bytes) {
    std::ostringstream os;
    os << "out of memory on device '" << name_ << "': tried to allocate " << mib(size) << " with "
       << mib(stats_.current_bytes) << " in use and a budget of " << mib(stats_.budget_bytes);
    throw OutOfMemoryError(os.str());
  }
  void* ptr = nullptr;
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.cache_hits;
  } else {
    // The cache counts against the budget as a GPU's reserved memory does: drop it if needed.
    if (stats_.current_bytes + stats_.cached_bytes + size > stats_.budget_bytes) {
      release_cache_locked();
    }
    ptr = std::aligned_alloc(64, size);
    if (ptr == nullptr) {
      release_cache_locked();
      ptr = std::aligned_alloc(64, size);
      if (ptr == nullptr) {
        throw OutOfMemoryError("out of host memory allocating " + mib(size) + " on device '" +
                               name_ + "'");
      }
    }
  }
  stats_.current_bytes += size;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  return ptr;
}

void Device::deallocate(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
  const std::size_t size = round_up(bytes == 0 ? 1 : bytes);
  std::lock_guard lock(mu_);
  stats_.current_bytes -= size;
  free_blocks_[size].push_back(ptr);
  stats_.cached_bytes += size;
}

MemoryStats Device::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Device::set_budget(std::size_t bytes) {
  std::lock_guard lock(mu_);
  stats_.budget_bytes = bytes;
}

void Device::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
}

void Device::empty_cache() {
  std::lock_guard lock(mu_);
  release_cache_locked();
}

void Device::release_cache_locked() {
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) std::free(p);
  }
  free_blocks_.clear();
  stats_.cached_bytes = 0;
}

void set_num_threads(int threads) { omp_set_num_threads(threads < 1 ? 1 : threads); }
int num_threads() { return omp_get_max_threads(); }

}  // namespace hpm
