#include "hpm/tensor/device.h"

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "hpm/tensor/backend.h"

namespace hpm {

namespace {
std::string mib(std::size_t bytes) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB";
  return os.str();
}

std::shared_ptr<MemoryResource> memory_of(DeviceId id) {
  if (id.type == DeviceType::kCpu) return std::make_shared<HostMemory>();
  return backend(id.type).memory(id.index);
}
}  // namespace

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda";
    case DeviceType::kPrivateUse:
      return "private";
  }
  return "?";
}

std::string DeviceId::str() const {
  if (type == DeviceType::kCpu) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

DeviceId parse_device_id(const std::string& text) {
  if (text == "cpu") return {};
  if (text == "cuda") return {DeviceType::kCuda, 0};
  const std::string prefix = "cuda:";
  if (text.rfind(prefix, 0) == 0 && text.size() > prefix.size() &&
      text.size() <= prefix.size() + 3 &&
      text.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
    return {DeviceType::kCuda, std::stoi(text.substr(prefix.size()))};
  }
  throw std::invalid_argument("device must be \"cpu\", \"cuda\" or \"cuda:N\", got \"" + text +
                              "\"");
}

double Event::seconds_since(const Event&) const {
  throw std::logic_error("this event has no timestamp: record it with Stream::record_timed");
}

std::shared_ptr<Event> InlineStream::record() {
  struct Done final : Event {
    std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
    void synchronize() override {}
    bool ready() const override { return true; }
    double seconds_since(const Event& earlier) const override {
      const auto* e = dynamic_cast<const Done*>(&earlier);
      if (e == nullptr) return Event::seconds_since(earlier);
      return std::chrono::duration<double>(at - e->at).count();
    }
  };
  return std::make_shared<Done>();
}

// ---- memory ------------------------------------------------------------------------------------

void* HostMemory::allocate(std::size_t bytes) { return std::aligned_alloc(64, bytes); }
void MemoryResource::fill(void* ptr, std::size_t bytes, unsigned char byte) {
  std::memset(ptr, byte, bytes);
}

namespace {
std::atomic<bool> poison_allocations{false};
}  // namespace

void Allocator::set_poison(bool on) { poison_allocations = on; }
void HostMemory::free(void* ptr, std::size_t) { std::free(ptr); }

Allocator::Allocator(std::string device_name, std::shared_ptr<MemoryResource> memory,
                     std::size_t budget_bytes)
    : device_name_(std::move(device_name)), memory_(std::move(memory)) {
  stats_.budget_bytes = budget_bytes;
}

Allocator::~Allocator() {
  std::lock_guard lock(mu_);
  release_cache_locked();
}

void* Allocator::allocate(std::size_t bytes) {
  const std::size_t size = memory_->round_size(bytes == 0 ? 1 : bytes);
  std::lock_guard lock(mu_);
  ++stats_.allocations;
  if (stats_.current_bytes + size > stats_.budget_bytes) {
    std::ostringstream os;
    os << "out of memory on device '" << device_name_ << "': tried to allocate " << mib(size)
       << " with " << mib(stats_.current_bytes) << " in use and a budget of "
       << mib(stats_.budget_bytes);
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
    ptr = memory_->allocate(size);
    if (ptr == nullptr) {
      release_cache_locked();
      ptr = memory_->allocate(size);
      if (ptr == nullptr) {
        throw OutOfMemoryError("out of memory allocating " + mib(size) + " on device '" +
                               device_name_ + "' (the device has no more)");
      }
    }
  }
  stats_.current_bytes += size;
  if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
  if (poison_allocations.load(std::memory_order_relaxed)) memory_->fill(ptr, size, 0xFF);
  return ptr;
}

void Allocator::deallocate(void* ptr, std::size_t bytes) {
  if (ptr == nullptr) return;
  const std::size_t size = memory_->round_size(bytes == 0 ? 1 : bytes);
  std::lock_guard lock(mu_);
  stats_.current_bytes -= size;
  free_blocks_[size].push_back(ptr);
  stats_.cached_bytes += size;
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Allocator::set_budget(std::size_t bytes) {
  std::lock_guard lock(mu_);
  stats_.budget_bytes = bytes;
}

void Allocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
}

void Allocator::empty_cache() {
  std::lock_guard lock(mu_);
  release_cache_locked();
}

void Allocator::release_cache_locked() {
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) memory_->free(p, size);
  }
  free_blocks_.clear();
  stats_.cached_bytes = 0;
}

// ---- devices -----------------------------------------------------------------------------------

Device::Device(std::string name, std::size_t budget_bytes, int threads)
    : Device(DeviceId{}, std::move(name), budget_bytes, threads) {}

Device::Device(DeviceId id, std::string name, std::size_t budget_bytes, int threads)
    : id_(id),
      name_(std::move(name)),
      threads_(threads),
      is_host_(id.type == DeviceType::kCpu || backend(id.type).is_host()),
      allocator_(name_, memory_of(id), budget_bytes),
      stream_(id.type == DeviceType::kCpu ? std::make_unique<InlineStream>(id)
                                          : backend(id.type).make_stream(id)) {}

Device::~Device() = default;

Device& Device::cpu() {
  // Leaked on purpose: tensors in static storage may outlive any other static.
  static Device* device = new Device("cpu", kUnlimited, 1);
  return *device;
}

Device& Device::host() {
  static Device* device = new Device("host", kUnlimited, 1);  // leaked, as cpu()
  return *device;
}

namespace {
thread_local Device* current_device = nullptr;
}  // namespace

Device& Device::current() { return current_device != nullptr ? *current_device : cpu(); }

DeviceGuard::DeviceGuard(Device& device) : previous_(current_device) { current_device = &device; }
DeviceGuard::~DeviceGuard() { current_device = previous_; }

void Device::set_threads(int threads) { threads_ = threads < 1 ? 1 : threads; }

void set_num_threads(int threads) { omp_set_num_threads(threads < 1 ? 1 : threads); }
int num_threads() { return omp_get_max_threads(); }

}  // namespace hpm
