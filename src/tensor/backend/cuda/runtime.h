// The CUDA runtime as the backend uses it: checked calls (an error names the call, file:line,
// CUDA's message and the op last dispatched), one context per device (its compute stream,
// cuBLAS handles, a cuBLAS workspace, pinned staging buffers for host copies), and the
// device pointer of a tensor. Plain C++ over the CUDA runtime API: both the backend's .cpp files
// and its kernels (.cu) include it.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hpm/tensor/tensor.h"

namespace hpm::cuda {

// Throws std::runtime_error: "<call> failed at <file>:<line>: <message> (the last op issued on
// this thread: <op>)".
[[noreturn]] void fail(const char* call, const char* file, int line, const std::string& message);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);

#define HPM_CUDA_CHECK(call)                                                             \
  do {                                                                                   \
    const cudaError_t hpm_cuda_error_ = (call);                                          \
    if (hpm_cuda_error_ != cudaSuccess) {                                                \
      ::hpm::cuda::fail(#call, __FILE__, __LINE__, cudaGetErrorString(hpm_cuda_error_)); \
    }                                                                                    \
  } while (0)
#define HPM_CUBLAS_CHECK(call) ::hpm::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration is reported here, a fault inside the kernel at the
// next synchronization (naming the op last issued; CUDA_LAUNCH_BLOCKING=1 pins it exactly).
#define HPM_CUDA_LAUNCH_CHECK(kernel_name) \
  ::hpm::cuda::check_launch(kernel_name, __FILE__, __LINE__)
void check_launch(const char* kernel, const char* file, int line);

// Whether f32 products and convolutions may run in TF32 (HPM_CUDA_ALLOW_TF32=1, as PyTorch's
// torch.backends.cuda.matmul.allow_tf32): off, they stay f32 throughout.
bool allow_tf32();

// An A/B switch of the environment for the benchmark (bench/gpu_gpt.py --ab-env): on unless the
// variable is "0".
bool ab_switch_on(const char* name);
// A path that is off by default (HPM_CUDA_LT_AUTOTUNE, HPM_CUDA_ATTENTION_CUDNN, ...): on only when
// the variable is "1".
bool opt_in_switch_on(const char* name);

// How many devices the driver reports; throws std::runtime_error saying what was found (no
// driver, no device) when there are none.
int device_count();

// The per-device state. Made on first use of the device; lives for the process.
// An index check issued on the device whose verdict waits for the host's next read
// (deferred_checks.h).
struct PendingCheck {
  Tensor values;  // the checked indices, kept until the word is read
  std::function<std::string(std::int64_t position, std::int64_t value)> describe;
  int word;                // its index in Context::check_words
  std::thread::id thread;  // the thread that issued it, which reads it
  bool launched;           // its kernel issued (IndexCheck gone): another thread may read it
  std::uint64_t id;        // unique on its device: a read that copied the word finds it by this
};

struct Context {
  int index = 0;
  // Every op of the device, and the copies to and from it. (A second stream for copies would
  // overlap little: a step's one read, its loss, is begun after its forward and waited for after
  // its update, the device busy meanwhile; the input's copies are small.)
  cudaStream_t compute = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLAS(Lt) workspace, on the compute stream
  std::size_t workspace_bytes = 0;
  // Pinned host buffers for copies: host <-> pinned by memcpy, pinned <-> device by DMA, two in
  // turn so that filling one overlaps the other's transfer.
  static constexpr int kStagingSlots = 2;
  static constexpr std::size_t kStagingBytes = std::size_t{8} << 20;
  void* staging[kStagingSlots] = {};
  cudaEvent_t staging_done[kStagingSlots] = {};
  std::mutex staging_mu;
  // Small host -> device copies (a step's positions, labels of a small batch) go through a ring of
  // kSmallSlots pinned slots instead, so that one waits only for the copy kSmallSlots before it,
  // not for whatever the stream runs between two uses of a staging buffer.
  static constexpr int kSmallSlots = 64;
  static constexpr std::size_t kSmallBytes = std::size_t{64} << 10;
  void* small = nullptr;  // kSmallSlots x kSmallBytes, pinned
  cudaEvent_t small_done[kSmallSlots] = {};
  int small_next = 0;  // under staging_mu
  // Index checks the host has not read yet (deferred_checks.h): kMaxChecks device words, all
  // ones while clear, and what each one checks.
  static constexpr int kMaxChecks = 64;
  unsigned long long* check_words = nullptr;
  bool check_word_used[kMaxChecks] = {};
  std::vector<PendingCheck> checks;  // in the order they were issued
  std::uint64_t next_check_id = 1;
  std::mutex checks_mu;
  // Reads begun for the host (host_read.h, host_reads.cpp): kReadSlots pinned slots of kReadBytes,
  // each with the event its copies end with; a slot is free again once its read was waited for
  // (under staging_mu).
  static constexpr int kReadSlots = 8;
  static constexpr std::size_t kReadBytes = 4096;
  void* reads = nullptr;
  cudaEvent_t read_done[kReadSlots] = {};
  bool read_busy[kReadSlots] = {};
};
Context& context(int index);
// The context of the calling thread's current device (Device::current(), which the dispatch makes
// the device of an op's inputs).
Context& current_context();
inline cudaStream_t current_stream() { return current_context().compute; }

// The device address of a tensor's first element (Tensor::raw_data is for host memory only).
inline void* device_ptr(const Tensor& t) {
  return static_cast<char*>(t.impl()->storage->data()) +
         t.impl()->offset * static_cast<std::int64_t>(dtype_size(t.dtype()));
}
template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(device_ptr(t));
}

// Blocks of 256 threads over n elements, capped (grid-stride loops do the rest).
inline unsigned blocks_for(std::int64_t n, int threads = 256) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

}  // namespace hpm::cuda
