#include "tensor/backend/cuda/cudnn_handle.h"

#include <map>
#include <mutex>

#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS) fail(call, file, line, cudnnGetErrorString(status));
}

cudnnHandle_t cudnn_handle() {
  static std::mutex mu;
  static auto* handles = new std::map<int, cudnnHandle_t>();  // for the process
  Context& c = current_context();
  std::lock_guard lock(mu);
  auto [it, fresh] = handles->try_emplace(c.index, nullptr);
  if (fresh) {
    HPM_CUDNN_CHECK(cudnnCreate(&it->second));
    HPM_CUDNN_CHECK(cudnnSetStream(it->second, c.compute));
  }
  return it->second;
}

}  // namespace hpm::cuda
