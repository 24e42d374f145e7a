// The parameters of ops, shared by the device-independent ops (kernels.h), the Backend interface
// (backend.h) and every backend.
#pragma once

namespace hpm::kernels {

enum class BinaryOp { Add, Sub, Mul, Div };
enum class UnaryOp { Neg, Exp, Log, Sqrt, Relu, Tanh, Sigmoid, Gelu, GeluTanh, Square };

struct Conv2dParams {
  int stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  // Forward only: apply ReLU to the output in the same pass (oneDNN post-op), saving the separate
  // ReLU's read and write of the whole activation. Backward kernels ignore it.
  bool relu = false;
  // Autocast asks for bf16: operands (x, w, grad_y rounded), f32 accumulation, y rounded to bf16
  // (as PyTorch's autocast), grad_x and grad_w in f32. The backend decides where it pays: the
  // CPU's only where oneDNN's native bf16 convolutions gain (cpu_backend.cpp); its im2col
  // fallback, for shapes oneDNN rejects, computes in f32.
  bool bf16 = false;
};

struct Pool2dParams {
  int kernel_h = 2, kernel_w = 2, stride_h = 2, stride_w = 2, pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling only (PyTorch's default)
};

// One Adam(W) step over n elements, in place: p *= decay (AdamW's decoupled decay, else 1);
// d = g + l2 * p; m = beta1 m + (1 - beta1) d; v = beta2 v + (1 - beta2) d^2; vmax = max(vmax, v)
// when vmax is given (AMSGrad); p -= step_size * m / (sqrt(v or vmax) / bias2_sqrt + eps).
struct AdamStep {
  float beta1, beta2, eps, decay, l2, step_size, bias2_sqrt;
};

// One SGD step, torch's: d = g + weight_decay * p; with momentum, buf = keep * buf + take * d
// (keep 0 and take 1 on the first step, which seeds the buffer with d; else momentum and
// 1 - dampening) and p -= lr * (nesterov ? d + momentum * buf : buf); without, p -= lr * d.
struct SgdStep {
  float lr, weight_decay, momentum, keep, take;
  bool nesterov;
};

}  // namespace hpm::kernels
