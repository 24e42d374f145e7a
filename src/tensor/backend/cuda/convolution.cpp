// 2-D convolution on cuDNN's convolution API: descriptors per call (cheap), the algorithm per
// shape from cuDNN's heuristics (cached), the workspace from the device's caching allocator.
#include "tensor/backend/cuda/convolution.h"

#include <array>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "tensor/backend/cuda/cudnn_handle.h"
#include "tensor/backend/cuda/runtime.h"

namespace hpm::cuda {

namespace {

struct Geometry {
  int n, c, h, w, oc, kh, kw, oh, ow;
};

Geometry geometry(const Shape& x, const Shape& w, const kernels::Conv2dParams& p) {
  if (x.rank() != 4 || w.rank() != 4 || x[1] != w[1]) {
    throw std::invalid_argument("conv2d: input " + x.str() + " (N,C,H,W) does not match weight " +
                                w.str() + " (OC,C,KH,KW)");
  }
  Geometry g{static_cast<int>(x[0]),
             static_cast<int>(x[1]),
             static_cast<int>(x[2]),
             static_cast<int>(x[3]),
             static_cast<int>(w[0]),
             static_cast<int>(w[2]),
             static_cast<int>(w[3]),
             0,
             0};
  g.oh = (g.h + 2 * p.pad_h - g.kh) / p.stride_h + 1;
  g.ow = (g.w + 2 * p.pad_w - g.kw) / p.stride_w + 1;
  if (g.oh <= 0 || g.ow <= 0) {
    throw std::invalid_argument("conv2d: kernel " + w.str() + " larger than padded input " +
                                x.str());
  }
  return g;
}

void check_f32(const Tensor& t, const char* what) {
  if (t.dtype() != DType::F32) {
    throw std::invalid_argument(std::string("conv2d: ") + what + " must be F32, got " +
                                dtype_name(t.dtype()));
  }
}

// The descriptors of one convolution, freed with it.
class Descriptors {
 public:
  Descriptors(const Geometry& g, const kernels::Conv2dParams& p) {
    HPM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    HPM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    HPM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias));
    HPM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    HPM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    HPM_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g.n, g.c, g.h, g.w));
    HPM_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, g.n, g.oc, g.oh, g.ow));
    HPM_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, g.oc, 1, 1));
    HPM_CUDNN_CHECK(
        cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, g.oc, g.c, g.kh, g.kw));
    // Cross-correlation, as every framework's "convolution".
    HPM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, p.pad_h, p.pad_w, p.stride_h, p.stride_w,
                                                    1, 1, CUDNN_CROSS_CORRELATION,
                                                    CUDNN_DATA_FLOAT));
    // FMA math: no TF32 unless asked (cuDNN's default math would use it on Ampere and later).
    HPM_CUDNN_CHECK(
        cudnnSetConvolutionMathType(conv, allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
  }
  ~Descriptors() {
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(bias);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyConvolutionDescriptor(conv);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

using Key = std::tuple<int, int, int, int, int, int, int, int, int, int, int, int, int>;
Key key_of(const Geometry& g, const kernels::Conv2dParams& p, int which) {
  return {which,
          g.n,
          g.c,
          g.h,
          g.w,
          g.oc,
          g.kh,
          g.kw,
          p.stride_h,
          p.stride_w,
          p.pad_h,
          p.pad_w,
          current_context().index};
}

// The first of cuDNN's ranked candidates that succeeds deterministically: `Perf` is one of its
// three AlgoPerf structs, `query` fills them.
template <typename Algo, typename Perf, typename Query>
Algo choose(const Key& key, Query query) {
  static std::mutex mu;
  static std::map<Key, Algo> cache;
  {
    std::lock_guard lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  std::array<Perf, 16> perf{};
  int found = 0;
  query(static_cast<int>(perf.size()), &found, perf.data());
  for (int i = 0; i < found; ++i) {
    if (perf[static_cast<std::size_t>(i)].status == CUDNN_STATUS_SUCCESS &&
        perf[static_cast<std::size_t>(i)].determinism == CUDNN_DETERMINISTIC) {
      std::lock_guard lock(mu);
      cache[key] = perf[static_cast<std::size_t>(i)].algo;
      return perf[static_cast<std::size_t>(i)].algo;
    }
  }
  throw std::runtime_error("conv2d: cuDNN offers no deterministic algorithm for this shape");
}

// A workspace of `bytes` from the device's caching allocator (freed in stream order).
Tensor workspace(std::size_t bytes, Device& device) {
  return Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::U8, device);
}

void relu_in_place(const Descriptors& d, const Tensor& y) {
  cudnnActivationDescriptor_t act = nullptr;
  HPM_CUDNN_CHECK(cudnnCreateActivationDescriptor(&act));
  HPM_CUDNN_CHECK(
      cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
  const float one = 1.0f, zero = 0.0f;
  const cudnnStatus_t s = cudnnActivationForward(cudnn_handle(), act, &one, d.y, device_ptr(y),
                                                 &zero, d.y, device_ptr(y));
  cudnnDestroyActivationDescriptor(act);
  HPM_CUDNN_CHECK(s);
}

}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const kernels::Conv2dParams& p) {
  const Geometry g = geometry(x.shape(), w.shape(), p);
  check_f32(x, "input");
  check_f32(w, "weight");
  if (bias.defined() && (bias.dtype() != DType::F32 || bias.numel() != g.oc)) {
    throw std::invalid_argument("conv2d: bias " + bias.shape().str() + " does not match weight " +
                                w.shape().str());
  }
  Tensor y = Tensor::empty({g.n, g.oc, g.oh, g.ow}, DType::F32, x.device());
  if (y.numel() == 0) return y;
  const Descriptors d(g, p);
  cudnnHandle_t h = cudnn_handle();
  const auto algo = choose<cudnnConvolutionFwdAlgo_t, cudnnConvolutionFwdAlgoPerf_t>(
      key_of(g, p, 0), [&](int want, int* found, cudnnConvolutionFwdAlgoPerf_t* perf) {
        HPM_CUDNN_CHECK(
            cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, want, found, perf));
      });
  std::size_t bytes = 0;
  HPM_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, algo, &bytes));
  const Tensor ws = workspace(bytes, x.device());
  const float one = 1.0f, zero = 0.0f;
  HPM_CUDNN_CHECK(cudnnConvolutionForward(h, &one, d.x, device_ptr(x), d.w, device_ptr(w), d.conv,
                                          algo, bytes ? device_ptr(ws) : nullptr, bytes, &zero, d.y,
                                          device_ptr(y)));
  if (bias.defined()) {
    HPM_CUDNN_CHECK(cudnnAddTensor(h, &one, d.bias, device_ptr(bias), &one, d.y, device_ptr(y)));
  }
  if (p.relu) relu_in_place(d, y);
  return y;
}

void conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w,
                     const kernels::Conv2dParams& p, Tensor* grad_x, Tensor* grad_w,
                     Tensor* grad_bias) {
  const Geometry g = geometry(x.shape(), w.shape(), p);
  check_f32(x, "input");
  check_f32(w, "weight");
  check_f32(grad_y, "output gradient");
  if (grad_y.shape() != Shape{g.n, g.oc, g.oh, g.ow}) {
    throw std::invalid_argument("conv2d backward: output gradient " + grad_y.shape().str() +
                                " does not match " + Shape{g.n, g.oc, g.oh, g.ow}.str());
  }
  const Descriptors d(g, p);
  cudnnHandle_t h = cudnn_handle();
  const float one = 1.0f, zero = 0.0f;
  const bool empty = grad_y.numel() == 0;
  if (grad_bias != nullptr) {
    // cuDNN overwrites it (beta 0); an empty batch leaves zeros.
    *grad_bias = empty ? Tensor::zeros({g.oc}, DType::F32, x.device())
                       : Tensor::empty({g.oc}, DType::F32, x.device());
    if (!empty) {
      HPM_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, d.y, device_ptr(grad_y), &zero, d.bias,
                                                   device_ptr(*grad_bias)));
    }
  }
  if (grad_w != nullptr) {
    *grad_w = empty ? Tensor::zeros(w.shape(), DType::F32, x.device())
                    : Tensor::empty(w.shape(), DType::F32, x.device());
    if (!empty) {
      const auto algo =
          choose<cudnnConvolutionBwdFilterAlgo_t, cudnnConvolutionBwdFilterAlgoPerf_t>(
              key_of(g, p, 1),
              [&](int want, int* found, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
                HPM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    h, d.x, d.y, d.conv, d.w, want, found, perf));
              });
      std::size_t bytes = 0;
      HPM_CUDNN_CHECK(
          cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, algo, &bytes));
      const Tensor ws = workspace(bytes, x.device());
      HPM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
          h, &one, d.x, device_ptr(x), d.y, device_ptr(grad_y), d.conv, algo,
          bytes ? device_ptr(ws) : nullptr, bytes, &zero, d.w, device_ptr(*grad_w)));
    }
  }
  if (grad_x != nullptr) {
    *grad_x = empty ? Tensor::zeros(x.shape(), DType::F32, x.device())
                    : Tensor::empty(x.shape(), DType::F32, x.device());
    if (!empty) {
      const auto algo = choose<cudnnConvolutionBwdDataAlgo_t, cudnnConvolutionBwdDataAlgoPerf_t>(
          key_of(g, p, 2), [&](int want, int* found, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
            HPM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x,
                                                                        want, found, perf));
          });
      std::size_t bytes = 0;
      HPM_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, algo, &bytes));
      const Tensor ws = workspace(bytes, x.device());
      HPM_CUDNN_CHECK(cudnnConvolutionBackwardData(
          h, &one, d.w, device_ptr(w), d.y, device_ptr(grad_y), d.conv, algo,
          bytes ? device_ptr(ws) : nullptr, bytes, &zero, d.x, device_ptr(*grad_x)));
    }
  }
}

}  // namespace hpm::cuda
