// cuDNN as the backend uses it: one handle per device on its compute stream (convolutions, the
// fused attention), and checked calls whose error names the call, file:line and cuDNN's message.
#pragma once
#include <cudnn.h>

namespace hpm::cuda {

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line);
#define HPM_CUDNN_CHECK(call) ::hpm::cuda::check_cudnn((call), #call, __FILE__, __LINE__)

// The handle of the calling thread's current device, on its compute stream; made on first use and
// kept for the process.
cudnnHandle_t cudnn_handle();

}  // namespace hpm::cuda
