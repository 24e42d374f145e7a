// The CPU backend: the kernels of this folder behind the Backend interface. Host memory, an inline
// stream, and the CPU's own policy: which dtype runs which kernel (oneDNN's bf16 products need
// AVX512_BF16 to pay).
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "hpm/tensor/backend.h"
#include "hpm/tensor/backend/cpu.h"

namespace hpm {
namespace {

// Autocast's bf16 for a convolution, where it pays on this CPU: where each output sums at least 32
// products (C_in x KH x KW). Below that (a first layer over one image channel: 9) vdpbf16ps has
// almost nothing to pair, and the bf16 conversion of the output gradient, on oneDNN's slower
// generic reorder, costs more than the convolution saves (cnn: conv1 65 + 62 ms either way per 200
// steps, its gradient's reorder 150 ms in bf16 against 77 in f32; ONEDNN_VERBOSE).
kernels::Conv2dParams paying(kernels::Conv2dParams p, const Tensor& weight) {
  p.bf16 = p.bf16 && weight.dim() == 4 && weight.size(1) * weight.size(2) * weight.size(3) >= 32;
  return p;
}
// The fused op with a 2x2/2 pool pools straight from the bf16 output and unpools straight into
// the bf16 gradient (pool_blocked.h): no conversion pass is left to pay for, and the pooling
// reads and the unpooling writes half the bytes (cnn, bf16, 1 thread: 5546 samples/s with conv1
// in bf16 against 5462 with it in f32, medians of 5 alternating runs).
kernels::Conv2dParams paying_fused(kernels::Conv2dParams p, const Tensor& weight,
                                   const kernels::Pool2dParams& pool) {
  const bool pool_2x2 = pool.kernel_h == 2 && pool.kernel_w == 2 && pool.stride_h == 2 &&
                        pool.stride_w == 2 && pool.pad_h == 0 && pool.pad_w == 0;
  if (!pool_2x2) return paying(p, weight);
  return p;
}

bool both_bf16(const Tensor& a, const Tensor& b) {
  return a.dtype() == DType::BF16 && b.dtype() == DType::BF16;
}

template <typename T>
void fill_as(Tensor& x, T value) {
  T* p = static_cast<T*>(x.raw_data());
  for (std::int64_t i = 0; i < x.numel(); ++i) p[i] = value;
}

// `product` (of a block of x's rows, F32) over x's rows a block at a time, each block rounded to
// bf16 into the result while in cache: to_bf16(product(x)) without its F32 matrix. A row's values
// do not depend on the block it is in (the products sum each output along k alone).
template <typename Product>
Tensor rounded_by_rows(const Tensor& x, Product&& product) {
  const std::int64_t rows = x.size(0);
  if (rows == 0) return cpu::to_bf16(product(x));
  constexpr std::int64_t kBlockElements = 1 << 18;  // 1 MiB of f32
  // At least this many rows a product: fewer make the product re-read its weight too often (a
  // GPT's classifier, 50304 wide, would take 5 rows at a time and read its weight 150 times
  // for 768 rows).
  constexpr std::int64_t kMinRows = 128;
  Tensor y;
  std::int64_t block = kMinRows;  // the first block's rows, before the output's width is known
  for (std::int64_t r = 0; r < rows;) {
    const std::int64_t len = std::min(block, rows - r);
    const Tensor part = product(x.narrow(r, len));
    const std::int64_t cols = part.size(1);
    if (!y.defined()) {
      y = Tensor::empty({rows, cols}, DType::BF16, x.device());
      block = std::max<std::int64_t>(kMinRows, kBlockElements / std::max<std::int64_t>(cols, 1));
    }
    cpu::f32_to_bf16(part.data<float>(), y.data<std::uint16_t>() + r * cols, len * cols);
    r += len;
  }
  return y;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DeviceType type) : type_(type) {}
  DeviceType type() const override { return type_; }
  bool is_host() const override { return true; }
  std::shared_ptr<MemoryResource> memory(int) override { return std::make_shared<HostMemory>(); }
  std::unique_ptr<Stream> make_stream(DeviceId id) override {
    return std::make_unique<InlineStream>(id);
  }
  void copy_bytes(void* dst, const Device&, const void* src, const Device&,
                  std::size_t bytes) override {
    std::memmove(dst, src, bytes);
  }
  bool native_bf16() const override { return cpu::native_bf16(); }

  void fill_(Tensor& x, float value) override {
    if (value == 0.0f) {
      std::memset(x.raw_data(), 0, x.nbytes());
      return;
    }
    switch (x.dtype()) {
      case DType::F32:
        return fill_as<float>(x, value);
      case DType::I64:
        return fill_as<std::int64_t>(x, static_cast<std::int64_t>(value));
      case DType::I32:
        return fill_as<std::int32_t>(x, static_cast<std::int32_t>(value));
      case DType::I8:
        return fill_as<std::int8_t>(x, static_cast<std::int8_t>(value));
      case DType::U8:
        return fill_as<std::uint8_t>(x, static_cast<std::uint8_t>(value));
      case DType::F64:
        return fill_as<double>(x, value);
      case DType::BF16:
      case DType::F16: {
        Tensor one = Tensor::full(Shape{}, value);
        const Tensor rounded = x.dtype() == DType::BF16 ? cpu::to_bf16(one) : cpu::to_f16(one);
        return fill_as<std::uint16_t>(x, *static_cast<const std::uint16_t*>(rounded.raw_data()));
      }
    }
  }

  // A BF16 output of BF16 operands whose rows are a's is rounded by the product as it writes it
  // (oneDNN's bf16 destination: the same kernels and values as the F32 one's, rounded, where a
  // transposed a can take another summation order for some elements); else the F32 product
  // rounded, a block of rows at a time where the rows are a's: the F32 product never exists whole
  // (the step's peak holds one block of it, as a GPU's holds none).
  Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType out) override {
    const auto product = [&](const Tensor& rows) {
      return both_bf16(rows, b) ? cpu::matmul_bf16(rows, b, trans_a, trans_b)
                                : cpu::matmul(rows, b, trans_a, trans_b);
    };
    if (out != DType::BF16) return product(a);
    if (both_bf16(a, b) && !trans_a && a.dim() == 2 && b.dim() == 2) {
      return cpu::matmul_bf16(a, b, trans_a, trans_b, /*out_bf16=*/true);
    }
    if (trans_a || a.dim() != 2) return cpu::to_bf16(product(a));
    return rounded_by_rows(a, product);
  }

  void matmul_add_(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a,
                   bool trans_b) override {
    if (a.dim() != 2 || b.dim() != 2) {
      throw std::invalid_argument("matmul_add_: 2-D operands expected, got " + a.shape().str() +
                                  " and " + b.shape().str());
    }
    const std::int64_t m = trans_a ? a.size(1) : a.size(0), k = trans_a ? a.size(0) : a.size(1);
    const std::int64_t n = trans_b ? b.size(0) : b.size(1);
    if ((trans_b ? b.size(1) : b.size(0)) != k) {
      throw std::invalid_argument("matmul_add_: inner dimensions differ: " + a.shape().str() +
                                  " and " + b.shape().str());
    }
    check_shape(c, Shape{m, n}, "matmul_add_ accumulator");
    if (both_bf16(a, b)) {
      cpu::gemm_bf16(trans_a, trans_b, m, n, k, 1.0f, a.data<std::uint16_t>(), a.size(1),
                     b.data<std::uint16_t>(), b.size(1), 1.0f, c.data<float>(), n);
    } else {
      cpu::gemm(trans_a, trans_b, m, n, k, 1.0f, a.data<float>(), a.size(1), b.data<float>(),
                b.size(1), 1.0f, c.data<float>(), n);
    }
  }

  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, DType out,
                const Tensor& residual) override {
    const auto product = [&](const Tensor& rows) {
      return both_bf16(rows, w) ? cpu::linear_bf16(rows, w, bias) : cpu::linear(rows, w, bias);
    };
    if (residual.defined()) {  // the product's values, then the residual added to each
      Tensor y = product(x);
      float* py = y.data<float>();
      const float* pr = residual.data<float>();
      for (std::int64_t i = 0; i < y.numel(); ++i) py[i] = pr[i] + py[i];
      return y;
    }
    if (out != DType::BF16) return product(x);
    if (x.dim() != 2) return cpu::to_bf16(product(x));
    return rounded_by_rows(x, product);
  }

  Tensor linear_param_grads_(Tensor& dw, const Tensor& g, const Tensor& x,
                             bool accumulate) override {
    // Shapes checked by the dispatch (kernels::linear_param_grads_).
    const std::int64_t out = g.size(1), in = x.size(1), n = g.size(0);
    const float beta = accumulate ? 1.0f : 0.0f;
    if (both_bf16(g, x)) {
      cpu::gemm_bf16(true, false, out, in, n, 1.0f, g.data<std::uint16_t>(), out,
                     x.data<std::uint16_t>(), in, beta, dw.data<float>(), in);
      return cpu::sum_dim(cpu::to_f32(g), 0, false);
    }
    if (g.dtype() != DType::F32 || x.dtype() != DType::F32) {
      throw std::invalid_argument(std::string("linear_param_grads_: operands must be both F32 or "
                                              "both BF16, got ") +
                                  dtype_name(g.dtype()) + " and " + dtype_name(x.dtype()));
    }
    cpu::gemm(true, false, out, in, n, 1.0f, g.data<float>(), out, x.data<float>(), in, beta,
              dw.data<float>(), in);
    return cpu::sum_dim(g, 0, false);
  }

  Tensor sum_all(const Tensor& x) override { return Tensor::scalar(cpu::sum_all(x)); }

  Tensor sum_squares(const Tensor& x) override {
    Tensor s = Tensor::empty(Shape{}, DType::F64);
    *s.data<double>() = cpu::sum_squares(x);
    return s;
  }

  Tensor squared_norm(const std::vector<Tensor>& xs) override {
    double total = 0.0;
    for (const Tensor& x : xs) total += cpu::sum_squares(x);
    Tensor s = Tensor::empty(Shape{}, DType::F64);
    *s.data<double>() = total;
    return s;
  }

  Tensor cross_entropy_forward(const Tensor& logits, const Tensor& labels, float label_smoothing,
                               Tensor& stats, std::int64_t ignore_index,
                               Tensor* predicted) override {
    return Tensor::scalar(cpu::cross_entropy_forward(logits, labels, label_smoothing, stats,
                                                     ignore_index, predicted));
  }

  Tensor cross_entropy_backward(const Tensor& logits, const Tensor& stats, const Tensor& labels,
                                float label_smoothing, const Tensor& grad,
                                std::int64_t ignore_index, bool overwrite_logits) override {
    return cpu::cross_entropy_backward(logits, stats, labels, label_smoothing, grad.item(),
                                       ignore_index, overwrite_logits);
  }
  Tensor cross_entropy_with_gradient_(Tensor& logits, const Tensor& labels, float label_smoothing,
                                      std::int64_t ignore_index, Tensor* predicted) override {
    return Tensor::scalar(cpu::cross_entropy_with_gradient_(logits, labels, label_smoothing,
                                                            ignore_index, predicted));
  }
  Tensor cross_entropy_backward_bf16(const Tensor& logits, const Tensor& stats,
                                     const Tensor& labels, float label_smoothing,
                                     const Tensor& grad, std::int64_t ignore_index,
                                     bool overwrite_logits) override {
    return cpu::cross_entropy_backward(logits, stats, labels, label_smoothing, grad.item(),
                                       ignore_index, overwrite_logits, DType::BF16);
  }

  Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           float scale, Tensor& lse) override {
    return q.dtype() == DType::BF16 ? cpu::attention_forward_bf16(q, k, v, causal, scale, lse)
                                    : cpu::attention_forward(q, k, v, causal, scale, lse);
  }

  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, bool causal, float scale,
                          Tensor* grad_q, Tensor* grad_k, Tensor* grad_v) override {
    // out may be the bf16 copy autocast kept: widened exactly, then read as f32.
    const Tensor o = out.dtype() == DType::BF16 ? cpu::to_f32(out) : out;
    if (q.dtype() == DType::BF16) {
      cpu::attention_backward_bf16(grad_out, q, k, v, o, lse, causal, scale, grad_q, grad_k,
                                   grad_v);
    } else {
      cpu::attention_backward(grad_out, q, k, v, o, lse, causal, scale, grad_q, grad_k, grad_v);
    }
  }

  // The composition packed_attention_forward_bf16 stands for, unchanged: the CPU's attention reads
  // heads laid out contiguously.
  Tensor packed_attention_forward_bf16(const Tensor& qkv, std::int64_t heads, bool causal,
                                       float scale, Tensor& lse) override {
    Tensor q, k, v;
    cpu::split_qkv_heads(qkv, heads, DType::BF16, q, k, v);
    return cpu::to_bf16(cpu::merge_heads(cpu::attention_forward_bf16(q, k, v, causal, scale, lse)));
  }

  Tensor packed_attention_backward(const Tensor& grad_out, const Tensor& qkv, const Tensor& out,
                                   const Tensor& lse, std::int64_t heads, bool causal, float scale,
                                   DType grad_dtype) override {
    Tensor q, k, v, gq, gk, gv;
    cpu::split_qkv_heads(qkv, heads, DType::BF16, q, k, v);
    // A BF16 grad_out (a bf16 product's input gradient) widened: its values exactly.
    const Tensor g32 = grad_out.dtype() == DType::BF16 ? cpu::to_f32(grad_out) : grad_out;
    cpu::attention_backward_bf16(cpu::split_heads(g32, heads), q, k, v,
                                 cpu::split_heads(cpu::to_f32(out), heads), lse, causal, scale, &gq,
                                 &gk, &gv);
    const Tensor g = cpu::merge_qkv_heads(gq, gk, gv);
    return grad_dtype == DType::BF16 ? cpu::to_bf16(g) : g;
  }

  void adam_step_(const AdamStep& s, Tensor& p, const Tensor& g, Tensor& m, Tensor& v,
                  Tensor& vmax) override {
    const std::int64_t n = p.numel();
    for (const Tensor* t : {&g, static_cast<const Tensor*>(&m), static_cast<const Tensor*>(&v)}) {
      if (t->numel() != n) throw std::invalid_argument("adam_step_: state of another size");
    }
    if (vmax.defined() && vmax.numel() != n) {
      throw std::invalid_argument("adam_step_: vmax of another size");
    }
    cpu::adam_step(s, p.data<float>(), g.data<float>(), m.data<float>(), v.data<float>(),
                   vmax.defined() ? vmax.data<float>() : nullptr, n);
  }

  void adam_step_multi_(const AdamStep& s, const std::vector<Tensor>& params,
                        const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                        const std::vector<Tensor>& exp_avg_sq,
                        const std::vector<Tensor>& max_exp_avg_sq, const Tensor& grad_norm_sq,
                        float max_norm, const Tensor& halted) override {
    // clip_grad_norm's arithmetic, to the bit: the norm in double, its factor in float.
    float coef = 1.0f;
    if (grad_norm_sq.defined() && max_norm > 0.0f) {
      if (grad_norm_sq.dtype() != DType::F64 || grad_norm_sq.numel() != 1) {
        throw std::invalid_argument("adam_step_multi_: grad_norm_sq must be one F64 value");
      }
      const double norm_sq = *grad_norm_sq.data<double>();
      if (halted.defined() && !std::isfinite(norm_sq)) *halted.data<std::int32_t>() = 1;
      const auto norm = static_cast<float>(std::sqrt(norm_sq));
      const float c = max_norm / (norm + 1e-6f);
      if (c < 1.0f) coef = c;
    }
    if (halted.defined() && *halted.data<std::int32_t>() != 0) return;
    Tensor none;
    for (std::size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i], g = grads[i], m = exp_avg[i], v = exp_avg_sq[i];
      Tensor vmax = max_exp_avg_sq.empty() ? none : max_exp_avg_sq[i];
      if (coef != 1.0f) cpu::scale_(g, coef);
      adam_step_(s, p, g, m, v, vmax);
    }
  }

  // The CPU's index checks throw at their op: only the value decides.
  void halt_unless_finite_(Tensor& halted, const Tensor& value) override {
    if (!std::isfinite(*value.data<float>())) *halted.data<std::int32_t>() = 1;
  }
  void sgd_step_(const SgdStep& s, Tensor& p, const Tensor& g, Tensor& buf) override {
    const std::int64_t n = p.numel();
    if (g.numel() != n || (buf.defined() && buf.numel() != n)) {
      throw std::invalid_argument("sgd_step_: state of another size");
    }
    cpu::sgd_step(s, p.data<float>(), g.data<float>(), buf.defined() ? buf.data<float>() : nullptr,
                  n);
  }

  Tensor to_bf16(const Tensor& x) override { return cpu::to_bf16(x); }
  Tensor to_f32(const Tensor& x) override { return cpu::to_f32(x); }
  Tensor to_f16(const Tensor& x) override { return cpu::to_f16(x); }
  Tensor bmm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) override {
    return cpu::bmm(a, b, trans_a, trans_b);
  }
  Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) override {
    return cpu::binary(op, a, b);
  }
  Tensor add_scalar(const Tensor& a, float s) override {
    if (a.dtype() != DType::I64) return cpu::add_scalar(a, s);
    Tensor y = Tensor::empty(a.shape(), DType::I64);  // counters (BatchNorm's batch count)
    const auto* pa = a.data<std::int64_t>();
    auto* py = y.data<std::int64_t>();
    for (std::int64_t i = 0; i < a.numel(); ++i) py[i] = pa[i] + static_cast<std::int64_t>(s);
    return y;
  }
  Tensor mul_scalar(const Tensor& a, float s) override { return cpu::mul_scalar(a, s); }
  void axpy_(Tensor& y, float alpha, const Tensor& x) override { cpu::axpy_(y, alpha, x); }
  void scale_(Tensor& y, float alpha) override { cpu::scale_(y, alpha); }
  void scale_by_(Tensor& y, const Tensor& s) override { cpu::scale_by_(y, s.item()); }
  Tensor unary(UnaryOp op, const Tensor& x) override { return cpu::unary(op, x); }
  Tensor unary_backward_bf16(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                             const Tensor& y) override {
    return cpu::unary_backward_bf16(op, grad_y, x, y);
  }
  Tensor unary_bf16(UnaryOp op, const Tensor& x, Tensor* x_bf16) override {
    return cpu::unary_bf16(op, x, x_bf16);
  }
  Tensor unary_backward(UnaryOp op, const Tensor& grad_y, const Tensor& x,
                        const Tensor& y) override {
    return cpu::unary_backward(op, grad_y, x, y);
  }
  Tensor sum_dim(const Tensor& x, int dim, bool keepdim) override {
    return cpu::sum_dim(x, dim, keepdim);
  }
  Tensor sum_to(const Tensor& x, const Shape& shape) override { return cpu::sum_to(x, shape); }
  Tensor broadcast_to(const Tensor& x, const Shape& shape) override {
    return cpu::broadcast_to(x, shape);
  }
  Tensor argmax_last(const Tensor& x) override { return cpu::argmax_last(x); }
  Tensor count_matches(const Tensor& predicted, const Tensor& labels,
                       std::int64_t ignore_index) override {
    const auto* p = predicted.data<std::int64_t>();
    const auto* y = labels.data<std::int64_t>();
    std::int64_t matches = 0, counted = 0;
    for (std::int64_t i = 0; i < labels.numel(); ++i) {
      if (y[i] == ignore_index) continue;
      ++counted;
      matches += p[i] == y[i];
    }
    return Tensor::from_i64(std::vector<std::int64_t>{matches, counted}, Shape{2},
                            Device::current());
  }
  Tensor softmax(const Tensor& x, int dim) override { return cpu::softmax(x, dim); }
  Tensor log_softmax(const Tensor& x, int dim) override { return cpu::log_softmax(x, dim); }
  Tensor softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) override {
    return cpu::softmax_backward(grad_y, y, dim);
  }
  Tensor log_softmax_backward(const Tensor& grad_y, const Tensor& y, int dim) override {
    return cpu::log_softmax_backward(grad_y, y, dim);
  }
  Tensor transpose2d(const Tensor& x) override { return cpu::transpose2d(x); }
  Tensor permute(const Tensor& x, const std::vector<int>& perm) override {
    return cpu::permute(x, perm);
  }
  Tensor concat(const std::vector<Tensor>& xs, int dim) override { return cpu::concat(xs, dim); }
  Tensor narrow_copy(const Tensor& x, int dim, std::int64_t start, std::int64_t length) override {
    return cpu::narrow_copy(x, dim, start, length);
  }
  void narrow_add_(Tensor& y, int dim, std::int64_t start, const Tensor& part) override {
    cpu::narrow_add_(y, dim, start, part);
  }
  void split_qkv_heads(const Tensor& qkv, std::int64_t heads, DType dtype, Tensor& q, Tensor& k,
                       Tensor& v) override {
    cpu::split_qkv_heads(qkv, heads, dtype, q, k, v);
  }
  Tensor merge_qkv_heads(const Tensor& q, const Tensor& k, const Tensor& v) override {
    return cpu::merge_qkv_heads(q, k, v);
  }
  Tensor merge_qkv_heads_bf16(const Tensor& q, const Tensor& k, const Tensor& v) override {
    return cpu::to_bf16(cpu::merge_qkv_heads(q, k, v));
  }
  Tensor split_heads(const Tensor& x, std::int64_t heads) override {
    return cpu::split_heads(x, heads);
  }
  Tensor merge_heads(const Tensor& y) override { return cpu::merge_heads(y); }
  Tensor merge_heads_bf16(const Tensor& y, Tensor* y_bf16) override {
    if (y_bf16 != nullptr) *y_bf16 = cpu::to_bf16(y);
    return cpu::to_bf16(cpu::merge_heads(y));
  }
  Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) override {
    return cpu::where(cond, a, b);
  }
  Tensor masked_fill(const Tensor& x, const Tensor& mask, float value) override {
    return cpu::masked_fill(x, mask, value);
  }
  Tensor index_select0(const Tensor& x, const std::vector<std::int64_t>& indices) override {
    return cpu::index_select0(x, indices);
  }
  Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                        const Conv2dParams& p) override {
    return cpu::conv2d_forward(x, w, bias, paying(p, w));
  }
  void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                       const Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                       Tensor* grad_bias) override {
    cpu::conv2d_backward(grad_y, x, w, paying(p, w), grad_x, grad_w, grad_bias);
  }
  Tensor max_pool2d_forward(const Tensor& x, const Pool2dParams& p, Tensor& argmax) override {
    return cpu::max_pool2d_forward(x, p, argmax);
  }
  Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax,
                             const Shape& x_shape) override {
    return cpu::max_pool2d_backward(grad_y, argmax, x_shape);
  }
  Tensor conv2d_relu_max_pool2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                                        const Conv2dParams& p, const Pool2dParams& pool,
                                        Tensor& argmax) override {
    return cpu::conv2d_relu_max_pool2d_forward(x, w, bias, paying_fused(p, w, pool), pool, argmax);
  }
  void conv2d_relu_max_pool2d_backward(const Tensor& grad_pooled, const Tensor& argmax,
                                       const Tensor& x, const Tensor& w, const Conv2dParams& p,
                                       const Pool2dParams& pool, Tensor* grad_x, Tensor* grad_w,
                                       Tensor* grad_bias) override {
    cpu::conv2d_relu_max_pool2d_backward(grad_pooled, argmax, x, w, paying_fused(p, w, pool), pool,
                                         grad_x, grad_w, grad_bias);
  }
  Tensor avg_pool2d_forward(const Tensor& x, const Pool2dParams& p) override {
    return cpu::avg_pool2d_forward(x, p);
  }
  Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape,
                             const Pool2dParams& p) override {
    return cpu::avg_pool2d_backward(grad_y, x_shape, p);
  }
  Tensor batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                            Tensor& running_mean, Tensor& running_var, bool training,
                            float momentum, float eps, Tensor& save_mean,
                            Tensor& save_invstd) override {
    return cpu::batch_norm_forward(x, weight, bias, running_mean, running_var, training, momentum,
                                   eps, save_mean, save_invstd);
  }
  void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                           const Tensor& save_mean, const Tensor& save_invstd, bool training,
                           Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) override {
    cpu::batch_norm_backward(grad_y, x, weight, save_mean, save_invstd, training, grad_x,
                             grad_weight, grad_bias);
  }
  Tensor layer_norm_forward(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                            const Tensor& bias, float eps, Tensor& save_mean,
                            Tensor& save_rstd) override {
    return cpu::layer_norm_forward(x, normalized, weight, bias, eps, save_mean, save_rstd);
  }
  Tensor layer_norm_forward_bf16(const Tensor& x, std::int64_t normalized, const Tensor& weight,
                                 const Tensor& bias, float eps, Tensor& save_mean,
                                 Tensor& save_rstd, Tensor* x_bf16) override {
    return cpu::layer_norm_forward_bf16(x, normalized, weight, bias, eps, save_mean, save_rstd,
                                        x_bf16);
  }
  Tensor add_layer_norm_forward_bf16(const Tensor& a, const Tensor& b, std::int64_t normalized,
                                     const Tensor& weight, const Tensor& bias, float eps,
                                     Tensor& sum, Tensor& save_mean, Tensor& save_rstd,
                                     Tensor* sum_bf16) override {
    return cpu::add_layer_norm_forward_bf16(a, b, normalized, weight, bias, eps, sum, save_mean,
                                            save_rstd, sum_bf16);
  }
  void layer_norm_backward(const Tensor& grad_y, const Tensor& x, std::int64_t normalized,
                           const Tensor& weight, const Tensor& save_mean, const Tensor& save_rstd,
                           Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias,
                           Tensor* grad_x_bf16) override {
    cpu::layer_norm_backward(grad_y, x, normalized, weight, save_mean, save_rstd, grad_x,
                             grad_weight, grad_bias, grad_x_bf16);
  }
  Tensor embedding_forward(const Tensor& table, const Tensor& indices) override {
    return cpu::embedding_forward(table, indices);
  }
  void embedding_backward(const Tensor& grad_y, const Tensor& indices,
                          Tensor& grad_table) override {
    cpu::embedding_backward(grad_y, indices, grad_table);
  }
  Tensor dropout_mask(const Shape& shape, float p, Generator& gen) override {
    return cpu::dropout_mask(shape, p, gen);
  }

  Tensor nll_loss_forward(const Tensor& log_probs, const Tensor& labels) override {
    return Tensor::scalar(cpu::nll_loss_forward(log_probs, labels));
  }

  Tensor nll_loss_backward(const Tensor& grad, const Tensor& labels, const Shape& shape) override {
    return cpu::nll_loss_backward(grad.item(), labels, shape);
  }

  Tensor kl_div_forward(const Tensor& input_log_probs, const Tensor& target_probs) override {
    return Tensor::scalar(cpu::kl_div_forward(input_log_probs, target_probs));
  }

  void kl_div_backward(const Tensor& grad, const Tensor& input_log_probs,
                       const Tensor& target_probs, Tensor* grad_input,
                       Tensor* grad_target) override {
    cpu::kl_div_backward(grad.item(), input_log_probs, target_probs, grad_input, grad_target);
  }

  void channel_moments_(Tensor& sum, Tensor& sum_squares, const Tensor& x) override {
    cpu::channel_moments_(sum, sum_squares, x);
  }

  void running_stats_update_(Tensor& running_mean, Tensor& running_var, const Tensor& sum,
                             const Tensor& sum_squares, std::int64_t count,
                             float momentum) override {
    cpu::running_stats_update_(running_mean, running_var, sum, sum_squares, count, momentum);
  }

 private:
  DeviceType type_;
};

}  // namespace

std::shared_ptr<Backend> make_cpu_backend(DeviceType type) {
  return std::make_shared<CpuBackend>(type);
}

}  // namespace hpm
