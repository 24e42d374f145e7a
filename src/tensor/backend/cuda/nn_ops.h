// The CUDA backend's neural-network ops: softmax and cross-entropy (softmax.cu), layer norm
// (norm.cu), embedding (embedding.cu), the optimizer updates (optimizer.cu) and fused attention
// (attention.cu). Each has the parameter list of its Backend virtual (backend.h; kernels.h
// documents what it computes) and matches the CPU backend's results, dtypes and host-side errors.
// Every kernel runs on the current device's compute stream; results are deterministic run to run
// (fixed reduction orders, no float atomics).
#pragma once
#include <cstdint>

#include "hpm/tensor/op_params.h"
#include "hpm/tensor/tensor.h"

namespace hpm::cuda {

// ---- softmax and cross-entropy (softmax.cu) ---------------------------------------------------
Tensor softmax(const Tensor& x, int dim);
Tensor log_softmax(const Tensor& x, int dim);
Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim);
Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim);
// Returns a 0-d F32 tensor on the device. Checks the labels on the device; a bad one is the CPU's
// std::out_of_range, thrown at the host's next copy from the device (deferred_checks.h).
Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                             Tensor& stats, std::int64_t ignore_index, Tensor* predicted);
// `grad` is the 0-d upstream gradient on the device, read by the kernel (no host wait).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                              float label_smoothing, const Tensor& grad, std::int64_t ignore_index,
                              bool overwrite_logits);
Tensor cross_entropy_backward_bf16(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                   float label_smoothing, const Tensor& grad,
                                   std::int64_t ignore_index, bool overwrite_logits);
// The forward with its gradient for an upstream 1 written over the logits (kernels.h).
Tensor cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                    std::int64_t ignore_index, Tensor* predicted);

// ---- attention (attention.cu) -----------------------------------------------------------------
// F32 or BF16 q, k, v (the BF16 path rounds as attention_bf16.cpp); head size up to 256.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                         float scale, Tensor& lse);
void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, float scale,
                        Tensor* grad_q, Tensor* grad_k, Tensor* grad_v);
// Over a packed BF16 qkv (attention_packed.cpp): attention_mma.cu's kernels in place where they
// apply (head sizes 32, 64, 128, HPM_CUDA_ATTENTION unset or mma), else the composition of
// split_qkv_heads, attention and merge_heads_bf16 (and their backwards) the CPU runs.
Tensor packed_attention_forward_bf16(const Tensor& qkv, std::int64_t heads, bool causal,
                                     float scale, Tensor& lse);
Tensor packed_attention_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& out,
                                 const Tensor& lse, std::int64_t heads, bool causal, float scale,
                                 DType grad_dtype);

// ---- layer norm (norm.cu) ---------------------------------------------------------------------
Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                          const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd);
Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                               const Tensor& bias, float eps, Tensor& save_mean, Tensor& save_rstd,
                               Tensor* x_bf16);
Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                   const Tensor& weight, const Tensor& bias, float eps, Tensor& sum,
                                   Tensor& save_mean, Tensor& save_rstd, Tensor* sum_bf16);
void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                         const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                         Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                         Tensor* grad_x_bf16);

// ---- embedding (embedding.cu) -----------------------------------------------------------------
// The forward checks the indices on the device; a bad one is the CPU's std::out_of_range, thrown at
// the host's next copy from the device (deferred_checks.h).
Tensor embedding_forward(const Tensor& table, const Tensor& indices);
void embedding_backward(const Tensor& grad_y, const Tensor& indices, Tensor& grad_table);

// ---- optimizer updates (optimizer.cu) ---------------------------------------------------------
void adam_step_(const kernels::AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                Tensor& vmax);
void adam_step_multi_(const kernels::AdamStep& s, const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                      const std::vector<Tensor>& exp_avg_sq,
                      const std::vector<Tensor>& max_exp_avg_sq, const Tensor& grad_norm_sq,
                      float max_norm, const Tensor& halted);
void halt_unless_finite_(Tensor& halted, const Tensor& value);
void sgd_step_(const kernels::SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf);

}  // namespace hpm::cuda
