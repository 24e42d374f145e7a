// Attention over a packed BF16 qkv (B, T, 3E), a GPT block's qkv product as it comes: the mma
// kernels (attention_mma.h) read q, k and v where they lie, write the output merged (B, T, E) in
// bf16 (the next product's operand, and the output the backward reads), and write the gradient
// packed like qkv, so that no split or merge pass runs around them: per layer of GPT-2 small in
// a training step, the 3 copies of split_qkv_heads, merge_heads_bf16's read of the f32 output,
// split_heads of the output gradient and merge_qkv_heads_bf16's of the three gradients. Where the
// kernels do not apply, the composition the CPU runs, from this backend's own ops. Under
// HPM_CUDA_ATTENTION_CUDNN=1, cuDNN's fused attention where it has a plan (attention_cudnn.h).
#include <cstdint>

#include "tensor/backend/cuda/attention_cudnn.h"
#include "tensor/backend/cuda/attention_mma.h"
#include "tensor/backend/cuda/attention_tiled.h"
#include "tensor/backend/cuda/basic_ops.h"
#include "tensor/backend/cuda/kernel_support.h"
#include "tensor/backend/cuda/nn_ops.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

struct Packed {
  std::int64_t batch, t, e, d;
};

// The dispatcher has checked the shapes (dispatch.cpp); the dtypes again here, as every kernel
// file does before its raw pointers.
Packed packed_dims(const Tensor& qkv, std::int64_t heads) {
  require_dtype(qkv, DType::BF16);
  const std::int64_t e = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), e, e / heads};
}

// cuDNN reads whole 16-byte vectors: a tensor it takes starts on such a boundary (the caching
// allocator's blocks do; a view at an offset may not), and so do k's and v's columns and every
// head's (a head size that is a multiple of 8).
bool cudnn_takes(const Packed& p, const Tensor& t) {
  return p.batch > 0 && p.t > 0 && p.d % 8 == 0 &&
         reinterpret_cast<std::uintptr_t>(device_ptr(t)) % 16 == 0;
}

CudnnAttention cudnn_problem(const Packed& p, std::int64_t heads, bool causal, float scale) {
  return {p.batch, heads, p.t, p.d, causal, scale};
}

}  // namespace

Tensor packed_attention_forward_bf16(const Tensor& qkv, std::int64_t heads, bool causal,
                                     float scale, Tensor& lse) {
  const Packed p = packed_dims(qkv, heads);
  // Every row and head offset of a packed qkv is a multiple of 16 bytes at the kernels' head
  // sizes: its base decides the alignment.
  const void* x0 = device_ptr(qkv);
  if (cudnn_attention_requested() && cudnn_takes(p, qkv)) {
    Tensor out = Tensor::empty({p.batch, p.t, p.e}, DType::BF16);
    Tensor stats = Tensor::empty({p.batch, heads, p.t}, DType::F32);
    if (cudnn_attention_forward(cudnn_problem(p, heads, causal, scale), x0, device_ptr(out),
                                ptr<float>(stats))) {
      lse = stats;
      return out;
    }
  }
  if (!mma_attention_applies(p.d, x0, x0, x0) || !mma_forward_takes(scale)) {
    Tensor q, k, v;
    split_qkv_heads(qkv, heads, DType::BF16, q, k, v);
    return merge_heads_bf16(attention_forward(q, k, v, causal, scale, lse), nullptr);
  }
  Tensor out = Tensor::empty({p.batch, p.t, p.e}, DType::BF16);
  lse = Tensor::empty({p.batch, heads, p.t}, DType::F32);
  const auto* x = ptr<std::uint16_t>(qkv);
  mma_attention_forward(x, x + p.e, x + 2 * p.e, device_ptr(out), /*out_bf16=*/true,
                        ptr<float>(lse), p.batch * heads, p.t, p.t, static_cast<int>(p.d), causal,
                        scale, packed_attention(heads, p.d), current_stream());
  return out;
}

Tensor packed_attention_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, std::int64_t heads, bool causal, float scale,
                                 DType grad_dtype) {
  const Packed p = packed_dims(qkv, heads);
  // grad_out F32, or BF16 (a bf16 product's input gradient: the kernels' operand as it is).
  const bool grad_out_bf16 = grad_out.dtype() == DType::BF16;
  if (!grad_out_bf16) require_dtype(grad_out, DType::F32);
  require_dtype(out, DType::BF16);
  require_dtype(lse, DType::F32);
  const bool bf16 = grad_dtype == DType::BF16;
  const void* x0 = device_ptr(qkv);
  // cuDNN's gradients are BF16 from a BF16 output gradient: a GPT's under autocast (an F32 one
  // is kept F32 by hpm's kernels, and either backward takes either forward's lse).
  if (cudnn_attention_requested() && bf16 && grad_out_bf16 && cudnn_takes(p, qkv) &&
      cudnn_takes(p, out) && cudnn_takes(p, grad_out)) {
    Tensor g = Tensor::empty(qkv.shape(), DType::BF16);
    if (cudnn_attention_backward(cudnn_problem(p, heads, causal, scale), x0, device_ptr(out),
                                 device_ptr(grad_out), ptr<float>(lse), device_ptr(g))) {
      return g;
    }
  }
  if (!mma_attention_applies(p.d, x0, x0, x0)) {
    Tensor q, k, v, gq, gk, gv;
    split_qkv_heads(qkv, heads, DType::BF16, q, k, v);
    attention_backward(split_heads(grad_out_bf16 ? to_f32(grad_out) : grad_out, heads), q, k, v,
                       split_heads(to_f32(out), heads), lse, causal, scale, &gq, &gk, &gv);
    return bf16 ? merge_qkv_heads_bf16(gq, gk, gv) : merge_qkv_heads(gq, gk, gv);
  }
  const std::int64_t problems = p.batch * heads;
  const AttentionLayout layout = packed_attention(heads, p.d);
  const int d = static_cast<int>(p.d);
  cudaStream_t stream = current_stream();
  Tensor delta = Tensor::empty({problems * p.t > 0 ? problems * p.t : 1}, DType::F32);
  // The products' dO: grad_out itself when BF16, else rounded by the Delta kernel into a copy.
  const Tensor dout = grad_out_bf16 ? grad_out : Tensor::empty(grad_out.shape(), DType::BF16);
  mma_attention_delta(device_ptr(grad_out), grad_out_bf16, device_ptr(out), /*out_bf16=*/true,
                      ptr<float>(delta),
                      grad_out_bf16 ? nullptr : static_cast<std::uint16_t*>(device_ptr(dout)),
                      problems, p.t, d, layout, stream);
  // Every element is written: q's columns by the dq share sums (or the dq kernel), k's and v's
  // by the dk/dv kernel.
  Tensor g = Tensor::empty(qkv.shape(), grad_dtype);
  const auto* x = ptr<std::uint16_t>(qkv);
  auto* base = static_cast<unsigned char*>(device_ptr(g));
  const std::int64_t part = p.e * (bf16 ? 2 : 4);  // bytes from q's columns to k's, k's to v's
  const std::int64_t scratch_elements = mma_attention_scratch_elements(problems, p.t, d);
  const Tensor scratch =
      scratch_elements > 0 ? Tensor::empty({scratch_elements}, DType::F32) : Tensor();
  mma_attention_backward(x, x + p.e, x + 2 * p.e, ptr<std::uint16_t>(dout), ptr<float>(lse),
                         ptr<float>(delta), base, base + part, base + 2 * part, bf16, problems, p.t,
                         p.t, d, causal, scale, layout, stream,
                         scratch.defined() ? device_ptr(scratch) : nullptr);
  return g;
}

}  // namespace hpm::cuda
