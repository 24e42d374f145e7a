// The packed attention (attention_packed.cpp) on cuDNN's fused flash attention, as an alternative
// to hpm's own kernels (attention_mma.h), chosen by HPM_CUDA_ATTENTION_CUDNN=1. cuDNN's kernels for
// Hopper use its warpgroup products (wgmma) and tensor-memory copies, which hpm's mma.sync kernels
// do not; whether that pays at a GPT's shapes (head size 64, 1,024 positions) is what the bench's
// A/B says. The graphs are built through NVIDIA's cuDNN frontend (a header-only library over
// cuDNN's graph API, fetched by scripts/fetch_cudnn_frontend.sh), once per problem shape, and
// read q, k and v where the packed qkv holds them and write the output merged and the gradient
// packed, as hpm's kernels do: no copy around them. The backward asks for cuDNN's deterministic
// algorithm, so a run repeats bit for bit as with hpm's kernels. lse is the natural-log
// log-sum-exp of each query row's scaled scores on both paths, so either backward takes either
// forward's.
#pragma once
#include <cstdint>

namespace hpm::cuda {

// A packed attention problem: qkv (batch, t, 3 x heads x d) BF16, contiguous.
struct CudnnAttention {
  std::int64_t batch = 0, heads = 0, t = 0, d = 0;
  bool causal = false;
  float scale = 1.0f;
};

// HPM_CUDA_ATTENTION_CUDNN=1 (read once). In a build without the cuDNN frontend the first call
// says on stderr that hpm's kernels run instead.
bool cudnn_attention_requested();

// The output (batch, t, heads x d) BF16 and lse (batch, heads, t) F32 from qkv, on the current
// device's compute stream. False, with nothing written, where cuDNN has no plan for the problem
// (said once a problem on stderr): the caller runs hpm's kernels. The first call of a problem
// says on stderr that cuDNN runs it.
bool cudnn_attention_forward(const CudnnAttention& a, const void* qkv, void* out, float* lse);

// The gradient of qkv, packed like it, BF16, from the output's gradient dout (batch, t, heads x
// d) BF16 and the forward's output and lse. False, with nothing written, as above.
bool cudnn_attention_backward(const CudnnAttention& a, const void* qkv, const void* out,
                              const void* dout, const float* lse, void* dqkv);

}  // namespace hpm::cuda
