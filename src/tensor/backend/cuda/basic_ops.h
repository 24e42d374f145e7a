// The CUDA backend's element-wise, reduction and layout ops (elementwise.cu, reduce.cu,
// layout.cu): each with the parameter list of its Backend virtual (backend.h), so that the
// backend class forwards to them one to one, and with the CPU backend's semantics (kernels.h
// documents each; the same shapes, dtypes and errors, checked on the host before any launch).
// Every kernel runs on the current device's compute stream; none synchronizes.
#pragma once
#include <cstdint>
#include <vector>

#include "hpm/tensor/op_params.h"
#include "hpm/tensor/tensor.h"

namespace hpm::cuda {

using kernels::BinaryOp;
using kernels::UnaryOp;

// ---- conversions and element-wise maps (elementwise.cu) -------------------------------------
Tensor to_bf16(const Tensor& x);
std::vector<Tensor> to_bf16_many(const std::vector<Tensor>& xs);
Tensor to_f32(const Tensor& x);
Tensor to_f16(const Tensor& x);
void fill_(Tensor& x, float value);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& a, float s);
Tensor mul_scalar(const Tensor& a, float s);
void axpy_(Tensor& y, float alpha, const Tensor& x);
void scale_(Tensor& y, float alpha);
// y *= s (a one-element F32 tensor on the device), F32 or BF16 y; no pass where s is 1.
void scale_by_(Tensor& y, const Tensor& s);
Tensor unary(UnaryOp op, const Tensor& x);
Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y);
Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16);
Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x, const Tensor& y);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);

// ---- reductions and broadcasting (reduce.cu) ------------------------------------------------
Tensor sum_all(const Tensor& x);
Tensor sum_squares(const Tensor& x);
Tensor squared_norm(const std::vector<Tensor>& xs);
Tensor sum_dim(const Tensor& x, int dim, bool keepdim);
Tensor sum_to(const Tensor& x, const Shape& shape);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor argmax_last(const Tensor& x);
Tensor count_matches(const Tensor& predicted, const Tensor& labels, std::int64_t ignore_index);

// ---- layout (layout.cu) -----------------------------------------------------------------------
Tensor transpose2d(const Tensor& x);
Tensor permute(const Tensor& x, const std::vector<int>& perm);
Tensor concat(const std::vector<Tensor>& xs, int dim);
Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length);
void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part);
void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                     Tensor& v);
Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v);
Tensor merge_qkv_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v);
Tensor split_heads(const Tensor& x, std::int64_t heads);
Tensor merge_heads(const Tensor& y);
Tensor merge_heads_bf16(const Tensor& y, Tensor* y_bf16);
Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices);

}  // namespace hpm::cuda
