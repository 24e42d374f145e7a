// The CUDA runtime as the backend uses it: checked calls and the per-device contexts.
#include "tensor/backend/cuda/runtime.h"

#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "hpm/tensor/backend.h"

namespace hpm::cuda {

void fail(const char* call, const char* file, int line, const std::string& message) {
  std::string m =
      std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + message;
  if (const char* op = last_dispatched_op()) {
    m += std::string(" (the last op issued on this thread: ") + op +
         "; CUDA_LAUNCH_BLOCKING=1 makes a kernel's fault surface at its own op)";
  }
  throw std::runtime_error(m);
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(call, file, line, cublasGetStatusString(status));
}

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    fail((std::string("launching ") + kernel).c_str(), file, line, cudaGetErrorString(e));
  }
}

bool allow_tf32() {
  static const bool on = opt_in_switch_on("HPM_CUDA_ALLOW_TF32");
  return on;
}

bool ab_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v) != "0";
}

bool opt_in_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
    (void)cudaGetLastError();
    throw std::runtime_error(
        "no CUDA device: the CUDA driver is present but reports no GPU (cudaGetDeviceCount: " +
        std::string(cudaGetErrorString(e)) + ")");
  }
  if (e == cudaErrorInsufficientDriver || e == cudaErrorInitializationError ||
      e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice) {
    (void)cudaGetLastError();
    // The runtime says "insufficient driver" both when there is none and when it is too old.
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_LAZY);
    const std::string found = driver == nullptr
                                  ? "no CUDA driver is installed (libcuda.so.1 not found)"
                                  : "the CUDA driver is older than this build's CUDA runtime";
    if (driver != nullptr) dlclose(driver);
    throw std::runtime_error("no usable CUDA driver on this machine: " + found +
                             " (cudaGetDeviceCount: " + cudaGetErrorString(e) + ")");
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error("no CUDA device available (cudaGetDeviceCount: " +
                             std::string(cudaGetErrorString(e)) + ")");
  }
  return n;
}

namespace {

constexpr int kMaxDevices = 64;

std::unique_ptr<Context> make_context(int index) {
  auto c = std::make_unique<Context>();
  c->index = index;
  HPM_CUDA_CHECK(cudaSetDevice(index));
  // Non-blocking: the legacy default stream, which nothing here uses, does not serialize it.
  HPM_CUDA_CHECK(cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking));
  HPM_CUBLAS_CHECK(cublasCreate(&c->blas));
  HPM_CUBLAS_CHECK(cublasLtCreate(&c->lt));
  c->workspace_bytes = std::size_t{32} << 20;  // what cuBLAS asks for on Hopper
  HPM_CUDA_CHECK(cudaMalloc(&c->workspace, c->workspace_bytes));
  HPM_CUBLAS_CHECK(cublasSetStream(c->blas, c->compute));
  HPM_CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->workspace, c->workspace_bytes));
  // Deterministic products: no split-K reductions in atomics.
  HPM_CUBLAS_CHECK(cublasSetAtomicsMode(c->blas, CUBLAS_ATOMICS_NOT_ALLOWED));
  for (int s = 0; s < Context::kStagingSlots; ++s) {
    HPM_CUDA_CHECK(cudaMallocHost(&c->staging[s], Context::kStagingBytes));
    HPM_CUDA_CHECK(cudaEventCreateWithFlags(&c->staging_done[s], cudaEventDisableTiming));
  }
  HPM_CUDA_CHECK(cudaMallocHost(&c->small, Context::kSmallSlots * Context::kSmallBytes));
  for (cudaEvent_t& e : c->small_done)
    HPM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  HPM_CUDA_CHECK(cudaMallocHost(&c->reads, Context::kReadSlots * Context::kReadBytes));
  for (cudaEvent_t& e : c->read_done)
    HPM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  constexpr std::size_t kCheckBytes = Context::kMaxChecks * sizeof(unsigned long long);
  HPM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c->check_words), kCheckBytes));
  // On the compute stream, which the legacy default stream's cudaMemset would not be ordered
  // before (non-blocking): the words are clear before the first check's kernel runs.
  HPM_CUDA_CHECK(cudaMemsetAsync(c->check_words, 0xff, kCheckBytes, c->compute));
  return c;
}

}  // namespace

Context& context(int index) {
  static std::mutex mu;
  // Leaked on purpose, as the CPU device: tensors in static storage may be freed after any
  // static destructor ran.
  static auto* contexts = new std::array<std::unique_ptr<Context>, kMaxDevices>();
  if (index < 0 || index >= kMaxDevices) {
    throw std::out_of_range("cuda:" + std::to_string(index) + " is not a device index");
  }
  std::lock_guard lock(mu);
  auto& c = (*contexts)[static_cast<std::size_t>(index)];
  if (!c) c = make_context(index);
  return *c;
}

Context& current_context() {
  const DeviceId id = Device::current().id();
  if (id.type != DeviceType::kCuda) {
    throw std::logic_error("a CUDA kernel was issued while " + id.str() + " is the current device");
  }
  Context& c = context(id.index);
  // The runtime's current device follows hpm's (a thread may serve several GPUs).
  int runtime_device = -1;
  HPM_CUDA_CHECK(cudaGetDevice(&runtime_device));
  if (runtime_device != id.index) HPM_CUDA_CHECK(cudaSetDevice(id.index));
  return c;
}

}  // namespace hpm::cuda
