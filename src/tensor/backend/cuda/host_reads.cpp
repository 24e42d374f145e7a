#include "tensor/backend/cuda/host_reads.h"

#include <cstring>
#include <utility>

#include "tensor/backend/cuda/deferred_checks.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

constexpr std::size_t kCheckBytes = Context::kMaxChecks * sizeof(unsigned long long);

std::size_t aligned(std::size_t bytes) { return (bytes + 15) / 16 * 16; }

// Values copied now (a read that does not fit a slot): the wait has nothing left to do.
class CopiedNow final : public PendingRead {
 public:
  explicit CopiedNow(const std::vector<Tensor>& values) {
    for (const Tensor& v : values) host_.push_back(v.to(Device::cpu()));
  }
  std::vector<Tensor> wait() override { return std::move(host_); }

 private:
  std::vector<Tensor> host_;
};

class SlotRead final : public PendingRead {
 public:
  SlotRead(Context& c, int slot, const std::vector<Tensor>& values)
      : c_(&c), slot_(slot), values_(values) {
    try {
      issue();
    } catch (...) {
      release();  // no destructor runs for a constructor that throws
      throw;
    }
  }
  ~SlotRead() override {
    // Never waited for: the slot is free once its copies are done (no error to raise here).
    if (slot_ >= 0) {
      cudaEventSynchronize(c_->read_done[slot_]);
      release();
    }
  }
  SlotRead(const SlotRead&) = delete;
  SlotRead& operator=(const SlotRead&) = delete;

  std::vector<Tensor> wait() override {
    const cudaError_t done = cudaEventSynchronize(c_->read_done[slot_]);
    if (done != cudaSuccess) {
      release();
      HPM_CUDA_CHECK(done);  // a fault of the work before the read, named
    }
    const char* base = slot_base();
    std::vector<Tensor> host;
    host.reserve(values_.size());
    for (std::size_t i = 0; i < values_.size(); ++i) {
      Tensor h = Tensor::empty(values_[i].shape(), values_[i].dtype(), Device::cpu());
      std::memcpy(h.raw_data(), base + offsets_[i], values_[i].nbytes());
      host.push_back(std::move(h));
    }
    unsigned long long words[Context::kMaxChecks];
    if (!checks_.empty()) std::memcpy(words, base + words_at_, kCheckBytes);
    release();
    values_.clear();
    // The device ran the work before the read: the checks it owes the host.
    if (!checks_.empty()) settle_checks(*c_, checks_, words);
    return host;
  }

 private:
  void issue() {
    char* base = slot_base();
    std::size_t at = 0;
    for (const Tensor& v : values_) {
      offsets_.push_back(at);
      HPM_CUDA_CHECK(cudaMemcpyAsync(base + at, device_ptr(v), v.nbytes(), cudaMemcpyDeviceToHost,
                                     c_->compute));
      at += aligned(v.nbytes());
    }
    checks_ = checks_of_this_thread(*c_);
    words_at_ = at;
    if (!checks_.empty()) {
      HPM_CUDA_CHECK(cudaMemcpyAsync(base + at, c_->check_words, kCheckBytes,
                                     cudaMemcpyDeviceToHost, c_->compute));
    }
    HPM_CUDA_CHECK(cudaEventRecord(c_->read_done[slot_], c_->compute));
  }
  char* slot_base() const {
    return static_cast<char*>(c_->reads) + static_cast<std::size_t>(slot_) * Context::kReadBytes;
  }
  void release() {
    std::lock_guard lock(c_->staging_mu);
    c_->read_busy[slot_] = false;
    slot_ = -1;
  }

  Context* c_;
  int slot_;
  std::vector<Tensor> values_;  // kept until copied
  std::vector<std::size_t> offsets_;
  std::vector<CheckRef> checks_;
  std::size_t words_at_ = 0;
};

}  // namespace

std::unique_ptr<PendingRead> begin_read(const std::vector<Tensor>& values) {
  std::size_t bytes = kCheckBytes;
  for (const Tensor& v : values) bytes += aligned(v.nbytes());
  Context& c = context(values.front().device().id().index);
  HPM_CUDA_CHECK(cudaSetDevice(c.index));
  int slot = -1;
  if (bytes <= Context::kReadBytes) {
    std::lock_guard lock(c.staging_mu);
    for (int s = 0; s < Context::kReadSlots && slot < 0; ++s) {
      if (!c.read_busy[s]) {
        c.read_busy[s] = true;
        slot = s;
      }
    }
  }
  if (slot < 0) return std::make_unique<CopiedNow>(values);
  return std::make_unique<SlotRead>(c, slot, values);
}

}  // namespace hpm::cuda
