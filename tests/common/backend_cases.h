// The backend conformance cases: every op of the Backend interface on random inputs, run on the
// CPU and on a device under test with the same seed, compared (ggml's test-backend-ops). Backward
// kernels are ops of their own, so gradients are checked as ops too. Used by the conformance test
// of the tensor layer (the CPU backend as a second device type) and by the CUDA suite (cuda:0).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "hpm/tensor/backend.h"
#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::testing::backend_cases {

using kernels::BinaryOp;
using kernels::Conv2dParams;
using kernels::Pool2dParams;
using kernels::UnaryOp;
using Outputs = std::vector<Tensor>;
// Brings an input made on the CPU to the device under test (none: the CPU reference).
struct To {
  Device* device = nullptr;
  Tensor operator()(const Tensor& t) const { return device ? t.to(*device) : t; }
};

struct Case {
  std::string name;
  Op op;
  // Inputs drawn from `gen`, moved by `to`, the op run: its outputs (outputs written in place
  // included).
  std::function<Outputs(Generator& gen, const To& to)> run;
  float tolerance = 1e-4f;  // relative to the largest magnitude of the reference
};

inline Tensor randn(Generator& gen, const Shape& s) { return Tensor::randn(s, gen); }
inline Tensor positive(Generator& gen, const Shape& s) {
  return Tensor::uniform(s, gen, 0.1f, 2.0f);
}
inline Tensor mask(Generator& gen, const Shape& s) {
  Tensor m = Tensor::empty(s, DType::I8);
  for (std::int64_t i = 0; i < m.numel(); ++i) m.data<std::int8_t>()[i] = gen.uniform() < 0.4f;
  return m;
}
inline Tensor labels(Generator& gen, std::int64_t n, std::int64_t classes) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < n; ++i) {
    v.push_back(static_cast<std::int64_t>(gen.uniform() * static_cast<float>(classes)) % classes);
  }
  return Tensor::from_i64(v, Shape{n});
}

inline Tensor ids() {
  const std::vector<std::int64_t> v{3, 0, 6, 3, 1, 5};
  return Tensor::from_i64(v, Shape{2, 3});
}

// The cases; a backward case computes its other inputs (what the forward saved) on the CPU.
inline std::vector<Case> cases() {
  std::vector<Case> c;
  const float bf16_tolerance = 2e-2f;
  c.push_back({"to_bf16", Op::kToBf16, [](Generator& g, const To& to) {
                 return Outputs{kernels::to_bf16(to(randn(g, {33})))};
               }});
  // More tensors than one launch takes (64), an empty one, one of several chunks (8192), odd
  // lengths (the scalar tails), a view 4 bytes in (not 16-byte aligned), one already BF16.
  c.push_back({"to_bf16_many", Op::kToBf16Many, [](Generator& g, const To& to) {
                 std::vector<Tensor> xs{to(randn(g, {20011})), to(randn(g, {0})),
                                        to(randn(g, {9, 7})).narrow(1, 5),
                                        to(kernels::to_bf16(randn(g, {5})))};
                 for (int i = 0; i < 70; ++i) xs.push_back(to(randn(g, {1 + (i * 37) % 300})));
                 return Outputs{kernels::to_bf16_many(xs)};
               }});
  c.push_back({"to_f32", Op::kToF32, [](Generator& g, const To& to) {
                 return Outputs{kernels::to_f32(to(kernels::to_bf16(randn(g, {33}))))};
               }});
  c.push_back({"to_f16", Op::kToF16, [](Generator& g, const To& to) {
                 return Outputs{kernels::to_f16(to(randn(g, {33})))};
               }});
  c.push_back({"fill_", Op::kFill, [](Generator& g, const To& to) {
                 Tensor x = to(randn(g, {7})), i = to(Tensor::zeros({3}, DType::I64));
                 Tensor b = to(kernels::to_bf16(randn(g, {5})));
                 kernels::fill_(x, 2.5f);
                 kernels::fill_(i, 3.0f);
                 kernels::fill_(b, -1.25f);
                 return Outputs{x, i, b};
               }});
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::string t = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      c.push_back({"matmul " + t, Op::kMatmul, [=](Generator& g, const To& to) {
                     const Tensor a = randn(g, ta ? Shape{7, 5} : Shape{5, 7});
                     const Tensor b = randn(g, tb ? Shape{3, 7} : Shape{7, 3});
                     return Outputs{kernels::matmul(to(a), to(b), ta, tb)};
                   }});
      c.push_back({"matmul_add_ " + t, Op::kMatmulAdd, [=](Generator& g, const To& to) {
                     const Tensor a = randn(g, ta ? Shape{7, 5} : Shape{5, 7});
                     const Tensor b = randn(g, tb ? Shape{3, 7} : Shape{7, 3});
                     Tensor acc = to(randn(g, {5, 3}));
                     kernels::matmul_add_(acc, to(a), to(b), ta, tb);
                     return Outputs{acc};
                   }});
    }
  }
  c.push_back({"matmul bf16", Op::kMatmul,
               [](Generator& g, const To& to) {
                 const Tensor a = kernels::to_bf16(randn(g, {6, 16}));
                 const Tensor b = kernels::to_bf16(randn(g, {16, 5}));
                 return Outputs{kernels::matmul(to(a), to(b), false, false)};
               },
               bf16_tolerance});
  c.push_back({"matmul_add_ bf16", Op::kMatmulAdd,
               [](Generator& g, const To& to) {
                 const Tensor a = kernels::to_bf16(randn(g, {16, 6}));
                 const Tensor b = kernels::to_bf16(randn(g, {16, 5}));
                 Tensor acc = to(randn(g, {6, 5}));
                 kernels::matmul_add_(acc, to(a), to(b), true, false);
                 return Outputs{acc};
               },
               bf16_tolerance});
  c.push_back(
      {"bmm broadcast", Op::kBmm, [](Generator& g, const To& to) {
         const Tensor a = randn(g, {2, 3, 5, 4}), b = randn(g, {4, 6});
         const Tensor a2 = randn(g, {2, 4, 5}), b2 = randn(g, {2, 6, 4});
         return Outputs{kernels::bmm(to(a), to(b)), kernels::bmm(to(a2), to(b2), true, true)};
       }});
  c.push_back({"linear", Op::kLinear, [](Generator& g, const To& to) {
                 const Tensor x = randn(g, {4, 6}), w = randn(g, {3, 6}), b = randn(g, {3});
                 return Outputs{kernels::linear(to(x), to(w), to(b)),
                                kernels::linear(to(x), to(w), Tensor())};
               }});
  c.push_back({"linear bf16", Op::kLinear,
               [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(randn(g, {4, 32}));
                 const Tensor w = kernels::to_bf16(randn(g, {8, 32}));
                 return Outputs{kernels::linear(to(x), to(w), to(randn(g, {8})))};
               },
               bf16_tolerance});
  c.push_back({"linear gpt-shaped bf16", Op::kLinear,
               [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(randn(g, {192, 128}));
                 const Tensor w = kernels::to_bf16(randn(g, {384, 128}));
                 return Outputs{kernels::linear(to(x), to(w), to(randn(g, {384})))};
               },
               bf16_tolerance});
  // A residual added by the product (cuBLASLt's C on a GPU): f32 and bf16 operands, with a bias
  // (the fused path) and without (the product, then the sum).
  c.push_back({"linear with a residual", Op::kLinear,
               [](Generator& g, const To& to) {
                 const Tensor x = randn(g, {192, 128}), w = randn(g, {384, 128});
                 const Tensor b = randn(g, {384}), r = randn(g, {192, 384});
                 const Tensor xb = kernels::to_bf16(x), wb = kernels::to_bf16(w);
                 return Outputs{
                     kernels::linear(to(xb), to(wb), to(b), DType::F32, to(r)),
                     kernels::linear(to(x), to(w), to(b), DType::F32, to(r)),
                     kernels::linear(to(xb), to(wb), Tensor(), DType::F32, to(r)),
                     kernels::linear(to(randn(g, {7, 13})), to(randn(g, {5, 13})),
                                     to(randn(g, {5})), DType::F32, to(randn(g, {7, 5})))};
               },
               bf16_tolerance});
  // Products writing bf16 (the f32 result rounded as written): with and without a bias, and an
  // odd shape (no 16-byte multiple: cuBLASLt's epilogue may decline it, then the composition).
  c.push_back({"linear and matmul to bf16", Op::kLinear,
               [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(randn(g, {192, 128}));
                 const Tensor w = kernels::to_bf16(randn(g, {384, 128}));
                 const Tensor x2 = kernels::to_bf16(randn(g, {7, 13}));
                 const Tensor w2 = kernels::to_bf16(randn(g, {5, 13}));
                 return Outputs{kernels::linear(to(x), to(w), to(randn(g, {384})), DType::BF16),
                                kernels::linear(to(x), to(w), Tensor(), DType::BF16),
                                kernels::linear(to(x2), to(w2), to(randn(g, {5})), DType::BF16),
                                kernels::matmul(to(x), to(w), false, true, DType::BF16),
                                kernels::matmul(to(x2), to(w2), false, true, DType::BF16)};
               },
               bf16_tolerance});
  for (bool accumulate : {false, true}) {
    c.push_back({std::string("linear_param_grads_ ") + (accumulate ? "accumulate" : "fresh"),
                 Op::kLinearParamGrads, [accumulate](Generator& g, const To& to) {
                   const Tensor gy = randn(g, {40, 24}), x = randn(g, {40, 36});
                   Tensor dw = to(randn(g, {24, 36}));
                   const Tensor db = kernels::linear_param_grads_(dw, to(gy), to(x), accumulate);
                   return Outputs{dw, db};
                 }});
  }
  for (bool accumulate : {false, true}) {
    c.push_back({std::string("linear_param_grads_ bf16 ") + (accumulate ? "accumulate" : "fresh"),
                 Op::kLinearParamGrads,
                 [accumulate](Generator& g, const To& to) {
                   const Tensor gy = kernels::to_bf16(randn(g, {256, 64}));
                   const Tensor x = kernels::to_bf16(randn(g, {256, 96}));
                   Tensor dw = to(randn(g, {64, 96}));
                   const Tensor db = kernels::linear_param_grads_(dw, to(gy), to(x), accumulate);
                   return Outputs{dw, db};
                 },
                 bf16_tolerance});
  }
  c.push_back(
      {"linear_param_grads_ no rows", Op::kLinearParamGrads, [](Generator& g, const To& to) {
         Tensor dw = to(randn(g, {5, 3}));
         const Tensor db = kernels::linear_param_grads_(dw, to(Tensor::zeros({0, 5})),
                                                        to(Tensor::zeros({0, 3})), false);
         return Outputs{dw, db};
       }});
  for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div}) {
    c.push_back(
        {"binary", Op::kBinary, [op](Generator& g, const To& to) {
           const Tensor a = randn(g, {4, 3}), b = positive(g, {3});
           const Tensor a2 = randn(g, {2, 1, 3}), b2 = positive(g, {4, 1});
           return Outputs{kernels::binary(op, to(a), to(b)), kernels::binary(op, to(a2), to(b2))};
         }});
  }
  c.push_back({"add_scalar", Op::kAddScalar, [](Generator& g, const To& to) {
                 const std::vector<std::int64_t> counter{41};
                 return Outputs{kernels::add_scalar(to(randn(g, {9})), 1.5f),
                                kernels::add_scalar(to(Tensor::from_i64(counter, {1})), 1.0f)};
               }});
  c.push_back({"mul_scalar", Op::kMulScalar, [](Generator& g, const To& to) {
                 return Outputs{kernels::mul_scalar(to(randn(g, {9})), -0.5f)};
               }});
  c.push_back({"axpy_", Op::kAxpy, [](Generator& g, const To& to) {
                 Tensor y = to(randn(g, {2, 5}));
                 kernels::axpy_(y, 0.25f, to(randn(g, {10})));
                 return Outputs{y};
               }});
  c.push_back({"scale_", Op::kScale, [](Generator& g, const To& to) {
                 Tensor y = to(randn(g, {11}));
                 kernels::scale_(y, 3.0f);
                 return Outputs{y};
               }});
  for (UnaryOp op :
       {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Relu, UnaryOp::Tanh,
        UnaryOp::Sigmoid, UnaryOp::Gelu, UnaryOp::GeluTanh, UnaryOp::Square}) {
    const bool needs_positive = op == UnaryOp::Log || op == UnaryOp::Sqrt;
    c.push_back({"unary", Op::kUnary, [=](Generator& g, const To& to) {
                   const Tensor x = needs_positive ? positive(g, {3, 7}) : randn(g, {3, 7});
                   return Outputs{kernels::unary(op, to(x))};
                 }});
    c.push_back({"unary_backward", Op::kUnaryBackward, [=](Generator& g, const To& to) {
                   const Tensor x = needs_positive ? positive(g, {3, 7}) : randn(g, {3, 7});
                   const Tensor y = kernels::unary(op, x), gy = randn(g, {3, 7});
                   return Outputs{kernels::unary_backward(op, to(gy), to(x), to(y))};
                 }});
    // Rounding after the same f32 value: equal to the CPU's within one bf16 step.
    c.push_back({"unary_bf16", Op::kUnaryBf16,
                 [=](Generator& g, const To& to) {
                   const Tensor x = needs_positive ? positive(g, {9, 130}) : randn(g, {9, 130});
                   Tensor xb;
                   const Tensor y = kernels::unary_bf16(op, to(x), &xb);
                   return Outputs{y, xb, kernels::unary_bf16(op, to(x))};
                 },
                 bf16_tolerance});
  }
  c.push_back({"sum_all", Op::kSumAll, [](Generator& g, const To& to) {
                 return Outputs{kernels::sum_all(to(randn(g, {5, 9})))};
               }});
  c.push_back({"sum_squares", Op::kSumSquares, [](Generator& g, const To& to) {
                 return Outputs{kernels::sum_squares(to(randn(g, {5, 9})))};
               }});
  c.push_back({"squared_norm", Op::kSquaredNorm, [](Generator& g, const To& to) {
                 return Outputs{kernels::squared_norm({to(randn(g, {5, 9})), to(randn(g, {7}))})};
               }});
  // More tensors than one launch takes (48), an empty one, one of several chunks (16384).
  c.push_back({"squared_norm many", Op::kSquaredNorm, [](Generator& g, const To& to) {
                 std::vector<Tensor> xs{to(randn(g, {100003})), to(randn(g, {0}))};
                 for (int i = 0; i < 60; ++i) xs.push_back(to(randn(g, {1 + (i * 53) % 500})));
                 return Outputs{kernels::squared_norm(xs)};
               }});
  c.push_back({"sum_dim", Op::kSumDim, [](Generator& g, const To& to) {
                 const Tensor x = to(randn(g, {3, 4, 5}));
                 return Outputs{kernels::sum_dim(x, 1, false), kernels::sum_dim(x, -1, true)};
               }});
  c.push_back(
      {"sum_dim and softmax of empty dimensions", Op::kSumDim, [](Generator&, const To& to) {
         const Tensor x = to(Tensor::zeros({2, 0, 3})), rows = to(Tensor::zeros({0, 4}));
         return Outputs{kernels::sum_dim(x, 1, false), kernels::sum_dim(x, 2, true),
                        kernels::sum_dim(rows, 0, false),
                        kernels::softmax(to(Tensor::zeros({3, 0})), -1)};
       }});
  c.push_back({"sum_to", Op::kSumTo, [](Generator& g, const To& to) {
                 return Outputs{kernels::sum_to(to(randn(g, {2, 3, 4})), Shape{3, 1})};
               }});
  c.push_back({"broadcast_to", Op::kBroadcastTo, [](Generator& g, const To& to) {
                 return Outputs{kernels::broadcast_to(to(randn(g, {3, 1})), Shape{2, 3, 4})};
               }});
  c.push_back({"argmax_last", Op::kArgmaxLast, [](Generator& g, const To& to) {
                 return Outputs{kernels::argmax_last(to(randn(g, {4, 9})))};
               }});
  // Sizes within one warp, across blocks; every 7th label ignored.
  for (std::int64_t n : {std::int64_t{30}, std::int64_t{100003}}) {
    c.push_back(
        {"count_matches " + std::to_string(n), Op::kCountMatches, [n](Generator& g, const To& to) {
           const Tensor predicted = kernels::argmax_last(randn(g, {n, 3}));
           std::vector<std::int64_t> y;
           for (std::int64_t i = 0; i < n; ++i) {
             y.push_back(i % 7 == 0 ? -100 : static_cast<std::int64_t>(g.uniform() * 3.0f) % 3);
           }
           return Outputs{
               kernels::count_matches(to(predicted), to(Tensor::from_i64(y, Shape{n})), -100)};
         }});
  }
  c.push_back({"softmax", Op::kSoftmax, [](Generator& g, const To& to) {
                 const Tensor x = to(randn(g, {3, 4, 5}));
                 return Outputs{kernels::softmax(x, -1), kernels::softmax(x, 1)};
               }});
  c.push_back({"log_softmax", Op::kLogSoftmax, [](Generator& g, const To& to) {
                 return Outputs{kernels::log_softmax(to(randn(g, {3, 6})), -1)};
               }});
  c.push_back({"softmax_backward", Op::kSoftmaxBackward, [](Generator& g, const To& to) {
                 const Tensor y = kernels::softmax(randn(g, {3, 6}), -1), gy = randn(g, {3, 6});
                 return Outputs{kernels::softmax_backward(to(gy), to(y), -1)};
               }});
  c.push_back({"log_softmax_backward", Op::kLogSoftmaxBackward, [](Generator& g, const To& to) {
                 const Tensor y = kernels::log_softmax(randn(g, {3, 6}), -1), gy = randn(g, {3, 6});
                 return Outputs{kernels::log_softmax_backward(to(gy), to(y), -1)};
               }});
  c.push_back({"cross_entropy_forward", Op::kCrossEntropyForward, [](Generator& g, const To& to) {
                 Tensor y = labels(g, 6, 5);
                 y.data<std::int64_t>()[2] = -100;  // ignored
                 Tensor stats;
                 const Tensor loss =
                     kernels::cross_entropy_forward(to(randn(g, {6, 5})), to(y), 0.1f, stats);
                 return Outputs{loss, stats};
               }});
  // From the CPU's stats, so that the backward alone is compared.
  c.push_back({"cross_entropy_backward", Op::kCrossEntropyBackward, [](Generator& g, const To& to) {
                 Tensor y = labels(g, 6, 5), stats;
                 y.data<std::int64_t>()[4] = -100;
                 const Tensor logits = randn(g, {6, 5});
                 kernels::cross_entropy_forward(logits, y, 0.1f, stats);
                 return Outputs{kernels::cross_entropy_backward(to(logits), to(stats), to(y), 0.1f,
                                                                to(Tensor::scalar(0.5f)))};
               }});
  c.push_back({"nll_loss_forward", Op::kNllLossForward, [](Generator& g, const To& to) {
                 const Tensor lp = kernels::log_softmax(randn(g, {6, 5}), -1);
                 return Outputs{kernels::nll_loss_forward(to(lp), to(labels(g, 6, 5)))};
               }});
  c.push_back({"nll_loss_backward", Op::kNllLossBackward, [](Generator& g, const To& to) {
                 return Outputs{kernels::nll_loss_backward(to(Tensor::scalar(0.7f)),
                                                           to(labels(g, 6, 5)), Shape{6, 5})};
               }});
  c.push_back({"kl_div_forward", Op::kKlDivForward, [](Generator& g, const To& to) {
                 const Tensor x = kernels::log_softmax(randn(g, {4, 5}), -1);
                 Tensor t = kernels::softmax(randn(g, {4, 5}), -1);
                 t.data<float>()[3] = 0.0f;  // a zero target counts zero
                 return Outputs{kernels::kl_div_forward(to(x), to(t))};
               }});
  c.push_back(
      {"kl_div_forward NaN target", Op::kKlDivForward, [](Generator& g, const To& to) {
         const Tensor x = kernels::log_softmax(randn(g, {2, 3}), -1);
         const Tensor t = Tensor::from({std::nanf(""), 0.5f, 0.5f, 0.2f, 0.3f, 0.5f}, {2, 3});
         return Outputs{kernels::kl_div_forward(to(x), to(t))};
       }});
  c.push_back({"kl_div_backward", Op::kKlDivBackward, [](Generator& g, const To& to) {
                 const Tensor x = kernels::log_softmax(randn(g, {4, 5}), -1);
                 Tensor t = kernels::softmax(randn(g, {4, 5}), -1);
                 t.data<float>()[7] = 0.0f;
                 Tensor gx, gt;
                 kernels::kl_div_backward(to(Tensor::scalar(1.5f)), to(x), to(t), &gx, &gt);
                 return Outputs{gx, gt};
               }});
  for (bool bf16 : {false, true}) {
    const auto q_of = [bf16](const Tensor& t) { return bf16 ? kernels::to_bf16(t) : t; };
    for (bool causal : {false, true}) {
      c.push_back(
          {"attention_forward", Op::kAttentionForward,
           [=](Generator& g, const To& to) {
             const Tensor q = q_of(randn(g, {2, 2, 5, 8})), k = q_of(randn(g, {2, 2, 5, 8}));
             const Tensor v = q_of(randn(g, {2, 2, 5, 8}));
             Tensor lse;
             const Tensor y = kernels::attention_forward(to(q), to(k), to(v), causal, 0.35f, lse);
             return Outputs{y, lse};
           },
           bf16 ? bf16_tolerance : 1e-4f});
      c.push_back(
          {"attention_backward", Op::kAttentionBackward,
           [=](Generator& g, const To& to) {
             const Tensor q = q_of(randn(g, {2, 2, 5, 8})), k = q_of(randn(g, {2, 2, 5, 8}));
             const Tensor v = q_of(randn(g, {2, 2, 5, 8})), gy = randn(g, {2, 2, 5, 8});
             Tensor lse;
             const Tensor y = kernels::attention_forward(q, k, v, causal, 0.35f, lse);
             Tensor gq, gk, gv;
             kernels::attention_backward(to(gy), to(q), to(k), to(v), to(y), to(lse), causal, 0.35f,
                                         &gq, &gk, &gv);
             return Outputs{gq, gk, gv};
           },
           bf16 ? bf16_tolerance : 1e-4f});
    }
  }
  c.push_back({"transpose2d", Op::kTranspose2d, [](Generator& g, const To& to) {
                 return Outputs{kernels::transpose2d(to(randn(g, {3, 7})))};
               }});
  c.push_back({"permute", Op::kPermute, [](Generator& g, const To& to) {
                 return Outputs{kernels::permute(to(randn(g, {2, 3, 4})), {2, 0, 1})};
               }});
  c.push_back({"concat", Op::kConcat, [](Generator& g, const To& to) {
                 return Outputs{kernels::concat({to(randn(g, {2, 3})), to(randn(g, {2, 5}))}, 1)};
               }});
  c.push_back({"narrow_copy", Op::kNarrowCopy, [](Generator& g, const To& to) {
                 return Outputs{kernels::narrow_copy(to(randn(g, {3, 8})), 1, 2, 4)};
               }});
  c.push_back({"narrow_add_", Op::kNarrowAdd, [](Generator& g, const To& to) {
                 Tensor y = to(randn(g, {3, 8}));
                 kernels::narrow_add_(y, 1, 3, to(randn(g, {3, 2})));
                 return Outputs{y};
               }});
  for (DType dtype : {DType::F32, DType::BF16}) {
    c.push_back({"split_qkv_heads", Op::kSplitQkvHeads, [dtype](Generator& g, const To& to) {
                   Tensor q, k, v;
                   kernels::split_qkv_heads(to(randn(g, {2, 5, 3 * 12})), 3, dtype, q, k, v);
                   return Outputs{q, k, v};
                 }});
  }
  c.push_back({"split_qkv_heads of bf16", Op::kSplitQkvHeads, [](Generator& g, const To& to) {
                 Tensor q, k, v;
                 kernels::split_qkv_heads(to(kernels::to_bf16(randn(g, {2, 5, 3 * 12}))), 3,
                                          DType::BF16, q, k, v);
                 return Outputs{q, k, v};
               }});
  c.push_back({"merge_qkv_heads", Op::kMergeQkvHeads, [](Generator& g, const To& to) {
                 return Outputs{kernels::merge_qkv_heads(to(randn(g, {2, 3, 5, 4})),
                                                         to(randn(g, {2, 3, 5, 4})),
                                                         to(randn(g, {2, 3, 5, 4})))};
               }});
  c.push_back({"split_heads", Op::kSplitHeads, [](Generator& g, const To& to) {
                 return Outputs{kernels::split_heads(to(randn(g, {2, 5, 12})), 3)};
               }});
  c.push_back({"merge_heads", Op::kMergeHeads, [](Generator& g, const To& to) {
                 return Outputs{kernels::merge_heads(to(randn(g, {2, 3, 5, 4})))};
               }});
  c.push_back({"merge_heads_bf16", Op::kMergeHeadsBf16,
               [](Generator& g, const To& to) {
                 const Tensor y = to(randn(g, {2, 3, 37, 16}));
                 Tensor yb;
                 const Tensor merged = kernels::merge_heads_bf16(y, &yb);
                 return Outputs{merged, yb, kernels::merge_heads_bf16(y)};
               },
               bf16_tolerance});
  c.push_back({"merge_qkv_heads_bf16", Op::kMergeQkvHeadsBf16,
               [](Generator& g, const To& to) {
                 return Outputs{kernels::merge_qkv_heads_bf16(to(randn(g, {2, 3, 37, 16})),
                                                              to(randn(g, {2, 3, 37, 16})),
                                                              to(randn(g, {2, 3, 37, 16})))};
               },
               bf16_tolerance});
  c.push_back({"where", Op::kWhere, [](Generator& g, const To& to) {
                 return Outputs{
                     kernels::where(to(mask(g, {4, 1})), to(randn(g, {4, 3})), to(randn(g, {3})))};
               }});
  c.push_back(
      {"masked_fill", Op::kMaskedFill, [](Generator& g, const To& to) {
         return Outputs{kernels::masked_fill(to(randn(g, {2, 4, 4})), to(mask(g, {4, 4})), -7.0f)};
       }});
  c.push_back({"index_select0", Op::kIndexSelect0, [](Generator& g, const To& to) {
                 return Outputs{kernels::index_select0(to(randn(g, {6, 2, 3})), {4, 0, 4, 5})};
               }});
  for (bool bf16 : {false, true}) {
    for (bool relu : {false, true}) {
      Conv2dParams p{2, 1, 1, 0, relu, bf16};
      const float tol = bf16 ? bf16_tolerance : 1e-4f;
      c.push_back({"conv2d_forward", Op::kConv2dForward,
                   [p](Generator& g, const To& to) {
                     return Outputs{kernels::conv2d_forward(to(randn(g, {2, 3, 9, 8})),
                                                            to(randn(g, {4, 3, 3, 3})),
                                                            to(randn(g, {4})), p)};
                   },
                   tol});
      c.push_back({"conv2d_backward", Op::kConv2dBackward,
                   [p](Generator& g, const To& to) {
                     const Tensor x = randn(g, {2, 3, 9, 8}), w = randn(g, {4, 3, 3, 3});
                     const Tensor gy = randn(g, kernels::conv2d_forward(x, w, Tensor(), p).shape());
                     Tensor gx, gw, gb;
                     kernels::conv2d_backward(to(gy), to(x), to(w), p, &gx, &gw, &gb);
                     return Outputs{gx, gw, gb};
                   },
                   tol});
    }
  }
  const Pool2dParams pool{3, 2, 2, 2, 1, 0, true};
  c.push_back(
      {"max_pool2d_forward", Op::kMaxPool2dForward, [pool](Generator& g, const To& to) {
         Tensor argmax;
         const Tensor y = kernels::max_pool2d_forward(to(randn(g, {2, 3, 7, 6})), pool, argmax);
         return Outputs{y, argmax};
       }});
  c.push_back({"max_pool2d_backward", Op::kMaxPool2dBackward, [pool](Generator& g, const To& to) {
                 Tensor argmax;
                 const Tensor y = kernels::max_pool2d_forward(randn(g, {2, 3, 7, 6}), pool, argmax);
                 return Outputs{kernels::max_pool2d_backward(to(randn(g, y.shape())), to(argmax),
                                                             Shape{2, 3, 7, 6})};
               }});
  for (bool bf16 : {false, true}) {
    const Conv2dParams p{1, 1, 1, 1, true, bf16};
    const Pool2dParams two{2, 2, 2, 2, 0, 0, true};
    const float tol = bf16 ? bf16_tolerance : 1e-4f;
    c.push_back({std::string("conv2d_relu_max_pool2d_forward") + (bf16 ? " bf16" : ""),
                 Op::kConv2dReluMaxPool2dForward,
                 [=](Generator& g, const To& to) {
                   Tensor argmax;
                   const Tensor y = kernels::conv2d_relu_max_pool2d_forward(
                       to(randn(g, {2, 3, 8, 8})), to(randn(g, {16, 3, 3, 3})), to(randn(g, {16})),
                       p, two, argmax);
                   // Under bf16 the CPU rounds the operands, and windows whose two largest
                   // values lie within that rounding may pick another winner: the values then.
                   return bf16 ? Outputs{y} : Outputs{y, argmax};
                 },
                 tol});
    c.push_back({"conv2d_relu_max_pool2d_backward", Op::kConv2dReluMaxPool2dBackward,
                 [=](Generator& g, const To& to) {
                   const Tensor x = randn(g, {2, 3, 8, 8}), w = randn(g, {16, 3, 3, 3});
                   const Tensor b = randn(g, {16});
                   Tensor argmax;
                   const Tensor y =
                       kernels::conv2d_relu_max_pool2d_forward(x, w, b, p, two, argmax);
                   Tensor gx, gw, gb;
                   kernels::conv2d_relu_max_pool2d_backward(to(randn(g, y.shape())), to(argmax),
                                                            to(x), to(w), p, two, &gx, &gw, &gb);
                   return Outputs{gx, gw, gb};
                 },
                 tol});
  }
  for (bool include_pad : {false, true}) {
    const Pool2dParams avg{3, 3, 2, 2, 1, 1, include_pad};
    c.push_back({"avg_pool2d_forward", Op::kAvgPool2dForward, [avg](Generator& g, const To& to) {
                   return Outputs{kernels::avg_pool2d_forward(to(randn(g, {2, 3, 7, 6})), avg)};
                 }});
    c.push_back({"avg_pool2d_backward", Op::kAvgPool2dBackward, [avg](Generator& g, const To& to) {
                   const Shape xs{2, 3, 7, 6};
                   const Tensor y = kernels::avg_pool2d_forward(randn(g, xs), avg);
                   return Outputs{kernels::avg_pool2d_backward(to(randn(g, y.shape())), xs, avg)};
                 }});
  }
  for (bool training : {true, false}) {
    c.push_back(
        {"batch_norm_forward", Op::kBatchNormForward, [training](Generator& g, const To& to) {
           Tensor rm = to(randn(g, {3})), rv = to(positive(g, {3})), sm, si;
           const Tensor y = kernels::batch_norm_forward(to(randn(g, {4, 3, 5})), to(randn(g, {3})),
                                                        to(randn(g, {3})), rm, rv, training, 0.1f,
                                                        1e-5f, sm, si);
           return training ? Outputs{y, rm, rv, sm, si} : Outputs{y, rm, rv};
         }});
    c.push_back(
        {"batch_norm_backward", Op::kBatchNormBackward, [training](Generator& g, const To& to) {
           const Tensor x = randn(g, {4, 3, 5}), w = randn(g, {3});
           Tensor rm = randn(g, {3}), rv = positive(g, {3}), sm, si;
           kernels::batch_norm_forward(x, w, randn(g, {3}), rm, rv, training, 0.1f, 1e-5f, sm, si);
           if (!training) {  // evaluation: the running statistics are what normalized
             sm = rm;
             si = kernels::unary(UnaryOp::Sqrt, kernels::add_scalar(rv, 1e-5f));
             si = kernels::binary(BinaryOp::Div, Tensor::ones({3}), si);
           }
           Tensor gx, gw, gb;
           kernels::batch_norm_backward(to(randn(g, {4, 3, 5})), to(x), to(w), to(sm), to(si),
                                        training, &gx, &gw, &gb);
           return Outputs{gx, gw, gb};
         }});
  }
  c.push_back({"channel_moments_", Op::kChannelMoments, [](Generator& g, const To& to) {
                 Tensor s = to(Tensor::zeros({3}, DType::F64)),
                        q = to(Tensor::zeros({3}, DType::F64));
                 kernels::channel_moments_(s, q, to(randn(g, {4, 3, 5})));
                 kernels::channel_moments_(s, q, to(randn(g, {2, 3, 5})));
                 return Outputs{s, q};
               }});
  c.push_back({"running_stats_update_", Op::kRunningStatsUpdate, [](Generator& g, const To& to) {
                 Tensor s = Tensor::zeros({3}, DType::F64), q = Tensor::zeros({3}, DType::F64);
                 kernels::channel_moments_(s, q, randn(g, {4, 3, 5}));
                 Tensor rm = to(randn(g, {3})), rv = to(positive(g, {3}));
                 kernels::running_stats_update_(rm, rv, to(s), to(q), 20, 0.1f);
                 return Outputs{rm, rv};
               }});
  c.push_back({"layer_norm_forward", Op::kLayerNormForward, [](Generator& g, const To& to) {
                 Tensor sm, sr;
                 const Tensor y =
                     kernels::layer_norm_forward(to(randn(g, {2, 3, 8})), 8, to(randn(g, {8})),
                                                 to(randn(g, {8})), 1e-5f, sm, sr);
                 return Outputs{y, sm, sr};
               }});
  // Rows on both sides of the CUDA kernel's warp/block switch (1024 elements).
  for (const std::int64_t width : {std::int64_t{96}, std::int64_t{1500}}) {
    c.push_back({"layer_norm_forward_bf16 " + std::to_string(width), Op::kLayerNormForwardBf16,
                 [width](Generator& g, const To& to) {
                   Tensor sm, sr, xb;
                   const Tensor x = to(randn(g, {5, width}));
                   const Tensor w = to(randn(g, {width})), b = to(randn(g, {width}));
                   const Tensor y =
                       kernels::layer_norm_forward_bf16(x, width, w, b, 1e-5f, sm, sr, &xb);
                   const Tensor y_no_bias =
                       kernels::layer_norm_forward_bf16(x, width, w, Tensor(), 1e-5f, sm, sr);
                   return Outputs{y, sm, sr, xb, y_no_bias};
                 },
                 bf16_tolerance});
  }
  for (const std::int64_t width : {std::int64_t{96}, std::int64_t{1500}}) {
    c.push_back(
        {"add_layer_norm_forward_bf16 " + std::to_string(width), Op::kAddLayerNormForwardBf16,
         [width](Generator& g, const To& to) {
           Tensor sum, sm, sr, sb, sum2, sm2, sr2;
           const Tensor a = to(randn(g, {5, width})), b = to(randn(g, {5, width}));
           const Tensor w = to(randn(g, {width})), bias = to(randn(g, {width}));
           const Tensor y =
               kernels::add_layer_norm_forward_bf16(a, b, width, w, bias, 1e-5f, sum, sm, sr, &sb);
           const Tensor y_plain = kernels::add_layer_norm_forward_bf16(
               a, b, width, Tensor(), Tensor(), 1e-5f, sum2, sm2, sr2);
           return Outputs{y, sum, sm, sr, sb, y_plain, sum2};
         },
         bf16_tolerance});
  }
  c.push_back({"layer_norm_backward", Op::kLayerNormBackward, [](Generator& g, const To& to) {
                 const Tensor x = randn(g, {2, 3, 8}), w = randn(g, {8});
                 Tensor sm, sr;
                 kernels::layer_norm_forward(x, 8, w, randn(g, {8}), 1e-5f, sm, sr);
                 Tensor gx, gw, gb;
                 kernels::layer_norm_backward(to(randn(g, {2, 3, 8})), to(x), 8, to(w), to(sm),
                                              to(sr), &gx, &gw, &gb);
                 return Outputs{gx, gw, gb};
               }});
  c.push_back({"embedding_forward", Op::kEmbeddingForward, [](Generator& g, const To& to) {
                 return Outputs{kernels::embedding_forward(to(randn(g, {7, 4})), to(ids()))};
               }});
  c.push_back({"embedding_backward", Op::kEmbeddingBackward, [](Generator& g, const To& to) {
                 Tensor table = to(randn(g, {7, 4}));
                 kernels::embedding_backward(to(randn(g, {2, 3, 4})), to(ids()), table);
                 return Outputs{table};
               }});
  for (bool amsgrad : {false, true}) {
    c.push_back({"adam_step_", Op::kAdamStep, [amsgrad](Generator& g, const To& to) {
                   Tensor p = to(randn(g, {10})), m = to(randn(g, {10}));
                   Tensor v = to(positive(g, {10}));
                   Tensor vmax = amsgrad ? to(positive(g, {10})) : Tensor();
                   const kernels::AdamStep s{0.9f, 0.999f, 1e-8f, 0.99f, 0.01f, 1e-3f, 0.3f};
                   kernels::adam_step_(s, p, to(randn(g, {10})), m, v, vmax);
                   return amsgrad ? Outputs{p, m, v, vmax} : Outputs{p, m, v};
                 }});
  }
  for (bool momentum : {false, true}) {
    c.push_back({"sgd_step_", Op::kSgdStep, [momentum](Generator& g, const To& to) {
                   Tensor p = to(randn(g, {10})), buf = momentum ? to(randn(g, {10})) : Tensor();
                   const kernels::SgdStep s{0.1f, 1e-4f, 0.9f, 0.9f, 0.95f, momentum};
                   kernels::sgd_step_(s, p, to(randn(g, {10})), buf);
                   return momentum ? Outputs{p, buf} : Outputs{p};
                 }});
  }
  // Sizes that are no multiple of any tile or warp, rows longer than a block, and NaN and Inf
  // in the inputs: where a GPU kernel's edges and special values go wrong.
  c.push_back({"matmul odd", Op::kMatmul, [](Generator& g, const To& to) {
                 const Tensor a = randn(g, {67, 129}), b = randn(g, {95, 129});
                 return Outputs{kernels::matmul(to(a), to(b), false, true),
                                kernels::matmul(to(b), to(a), false, true)};
               }});
  c.push_back({"linear odd bf16", Op::kLinear,
               [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(randn(g, {33, 200}));
                 const Tensor w = kernels::to_bf16(randn(g, {77, 200}));
                 return Outputs{kernels::linear(to(x), to(w), to(randn(g, {77})))};
               },
               2e-2f});
  c.push_back({"bmm heads odd", Op::kBmm, [](Generator& g, const To& to) {
                 const Tensor a = randn(g, {3, 5, 33, 17}), b = randn(g, {3, 5, 33, 19});
                 return Outputs{kernels::bmm(to(a), to(b), true, false)};
               }});
  c.push_back({"binary and unary with NaN and Inf", Op::kBinary, [](Generator& g, const To& to) {
                 Tensor a = randn(g, {3, 1037});
                 a.data<float>()[5] = std::nanf("");
                 a.data<float>()[1040] = INFINITY;
                 a.data<float>()[2000] = -INFINITY;
                 const Tensor b = positive(g, {1037});
                 return Outputs{kernels::binary(BinaryOp::Mul, to(a), to(b)),
                                kernels::unary(UnaryOp::Exp, to(a)),
                                kernels::unary(UnaryOp::Relu, to(a))};
               }});
  c.push_back({"sum_all long with Inf", Op::kSumAll, [](Generator& g, const To& to) {
                 Tensor x = randn(g, {100003});
                 const Tensor plain = to(x.clone());
                 x.data<float>()[777] = INFINITY;
                 return Outputs{kernels::sum_all(plain), kernels::sum_all(to(x)),
                                kernels::sum_squares(plain)};
               }});
  c.push_back({"sum_to bias gradient", Op::kSumTo, [](Generator& g, const To& to) {
                 return Outputs{kernels::sum_to(to(randn(g, {513, 257})), Shape{257}),
                                kernels::sum_to(to(randn(g, {7, 300, 9})), Shape{7, 1, 9})};
               }});
  c.push_back({"softmax long rows with NaN", Op::kSoftmax, [](Generator& g, const To& to) {
                 Tensor x = randn(g, {5, 3001});
                 x.data<float>()[3001 * 2 + 17] = std::nanf("");
                 return Outputs{kernels::softmax(to(x), -1), kernels::log_softmax(to(x), -1),
                                kernels::softmax(to(randn(g, {4, 301, 3})), 1)};
               }});
  // Rows whose max is -inf: all masked (zeros; log: -inf), or holding a NaN the max passes over
  // (NaN, as torch's: it was zeros, and the NaN vanished from the loss and its gradient). Rows
  // (warp teams) and columns (dim 0).
  c.push_back(
      {"softmax masked rows with NaN", Op::kSoftmax, [](Generator&, const To& to) {
         const float nan = std::nanf(""), inf = INFINITY;
         const Tensor x = Tensor::from({nan, nan, nan, -inf, -inf, -inf, 1.0f, nan}, {4, 2});
         const Tensor t = Tensor::from({nan, -inf, -inf, -inf}, {2, 2});
         return Outputs{kernels::softmax(to(x), -1), kernels::log_softmax(to(x), -1),
                        kernels::softmax(to(t), 0), kernels::log_softmax(to(t), 0)};
       }});
  c.push_back({"cross_entropy_forward vocabulary", Op::kCrossEntropyForward,
               [](Generator& g, const To& to) {
                 Tensor y = labels(g, 37, 5003), stats;
                 y.data<std::int64_t>()[30] = -100;
                 const Tensor loss =
                     kernels::cross_entropy_forward(to(randn(g, {37, 5003})), to(y), 0.1f, stats);
                 return Outputs{loss, stats};
               }});
  // The gradient written over the logits (the training step's case): the result shares them.
  c.push_back({"cross_entropy_backward in place", Op::kCrossEntropyBackward,
               [](Generator& g, const To& to) {
                 Tensor y = labels(g, 37, 1001);
                 y.data<std::int64_t>()[5] = -100;
                 const Tensor labels_there = to(y), logits = to(randn(g, {37, 1001}));
                 Tensor stats;
                 kernels::cross_entropy_forward(logits, labels_there, 0.1f, stats);
                 const Tensor gx = kernels::cross_entropy_backward(
                     logits, stats, labels_there, 0.1f, to(Tensor::scalar(0.5f)), -100, true);
                 return Outputs{gx, logits};  // the same values twice
               }});
  // Forward and backward on the device under test, the stats its own.
  c.push_back({"cross_entropy_backward vocabulary", Op::kCrossEntropyBackward,
               [](Generator& g, const To& to) {
                 const Tensor y = to(labels(g, 37, 5003)), logits = to(randn(g, {37, 5003}));
                 Tensor stats;
                 kernels::cross_entropy_forward(logits, y, 0.0f, stats);
                 return Outputs{kernels::cross_entropy_backward(logits, stats, y, 0.0f,
                                                                to(Tensor::scalar(1.0f)))};
               }});
  // The bf16 gradient: C across a block (5003), under a warp (65), ignored and smoothed rows.
  for (const std::int64_t classes : {std::int64_t{5003}, std::int64_t{65}}) {
    c.push_back({"cross_entropy_backward_bf16 " + std::to_string(classes),
                 Op::kCrossEntropyBackwardBf16,
                 [classes](Generator& g, const To& to) {
                   Tensor y = labels(g, 37, classes);
                   y.data<std::int64_t>()[3] = -100;
                   const Tensor yt = to(y), logits = to(randn(g, {37, classes}));
                   Tensor stats;
                   kernels::cross_entropy_forward(logits, yt, 0.1f, stats);
                   return Outputs{kernels::cross_entropy_backward_bf16(logits, stats, yt, 0.1f,
                                                                       to(Tensor::scalar(2.0f)))};
                 },
                 bf16_tolerance});
  }
  // The prediction made in cross-entropy's pass is argmax_last's: logits rounded to halves (ties
  // everywhere), a row whose largest values are -0 then +0 (the first wins), a NaN first (the
  // answer) and one elsewhere (passed over), a row of -inf; F32 and BF16, in a warp's rows (65
  // classes) and a block's (5003).
  for (const std::int64_t classes : {std::int64_t{5003}, std::int64_t{65}}) {
    for (const bool bf16 : {false, true}) {
      c.push_back({"cross_entropy_forward predicted " + std::string(bf16 ? "bf16 " : "") +
                       std::to_string(classes),
                   Op::kCrossEntropyForward, [classes, bf16](Generator& g, const To& to) {
                     Tensor x = randn(g, {9, classes});
                     float* p = x.data<float>();
                     for (std::int64_t i = 0; i < x.numel(); ++i)
                       p[i] = std::round(p[i] * 2.0f) / 2.0f;
                     for (std::int64_t j = 0; j < classes; ++j) {
                       p[j] = -1.0f - std::fabs(p[j]);
                       p[3 * classes + j] = -std::numeric_limits<float>::infinity();
                     }
                     p[3] = -0.0f;
                     p[classes - 2] = 0.0f;
                     p[classes] = std::nanf("");
                     p[2 * classes + 1] = std::nanf("");
                     const Tensor logits = bf16 ? kernels::to_bf16(x) : x;
                     Tensor stats, predicted;
                     const Tensor loss = kernels::cross_entropy_forward(
                         to(logits), to(labels(g, 9, classes)), 0.0f, stats, -100, &predicted);
                     return Outputs{loss, stats, predicted};
                   }});
    }
  }
  // bf16 logits (a language model's under autocast): across a block (5003) and under a warp
  // (65); both gradients, the bf16 one also written over the logits; argmax.
  for (const std::int64_t classes : {std::int64_t{5003}, std::int64_t{65}}) {
    const std::string size = " bf16 logits " + std::to_string(classes);
    // The labels, the logits and the CPU forward's statistics, moved.
    const auto inputs = [classes](Generator& g, const To& to, Tensor& y, Tensor& stats) {
      Tensor labels_cpu = labels(g, 37, classes), stats_cpu;
      labels_cpu.data<std::int64_t>()[3] = -100;
      const Tensor logits = kernels::to_bf16(randn(g, {37, classes}));
      kernels::cross_entropy_forward(logits, labels_cpu, 0.1f, stats_cpu);
      y = to(labels_cpu);
      stats = to(stats_cpu);
      return to(logits);
    };
    c.push_back({"cross_entropy_forward" + size, Op::kCrossEntropyForward,
                 [inputs](Generator& g, const To& to) {
                   Tensor y, stats;
                   const Tensor logits = inputs(g, to, y, stats);
                   Tensor again;
                   const Tensor loss = kernels::cross_entropy_forward(logits, y, 0.1f, again);
                   return Outputs{loss, again};
                 }});
    c.push_back({"cross_entropy_backward" + size, Op::kCrossEntropyBackward,
                 [inputs](Generator& g, const To& to) {
                   Tensor y, stats;
                   const Tensor logits = inputs(g, to, y, stats);
                   return Outputs{kernels::cross_entropy_backward(logits, stats, y, 0.1f,
                                                                  to(Tensor::scalar(2.0f)))};
                 }});
    c.push_back({"cross_entropy_backward_bf16" + size, Op::kCrossEntropyBackwardBf16,
                 [inputs](Generator& g, const To& to) {
                   Tensor y, stats;
                   const Tensor logits = inputs(g, to, y, stats);
                   const Tensor apart = kernels::cross_entropy_backward_bf16(
                       logits, stats, y, 0.1f, to(Tensor::scalar(2.0f)));
                   const Tensor over = kernels::cross_entropy_backward_bf16(
                       logits.clone(), stats, y, 0.1f, to(Tensor::scalar(2.0f)), -100, true);
                   return Outputs{apart, over};
                 },
                 bf16_tolerance});
    c.push_back(
        {"argmax_last" + size, Op::kArgmaxLast, [classes](Generator& g, const To& to) {
           return Outputs{kernels::argmax_last(to(kernels::to_bf16(randn(g, {37, classes}))))};
         }});
  }
  // The forward with the gradient for 1 written over the logits: F32 and BF16 logits, a warp's
  // rows (65, 256: eight a read) and a block's (5003, and 4104: 513 groups of eight), smoothed
  // and not, an ignored row; the loss, the gradient in the logits' place, the prediction.
  for (const std::int64_t classes :
       {std::int64_t{65}, std::int64_t{256}, std::int64_t{5003}, std::int64_t{4104}}) {
    for (const bool bf16 : {false, true}) {
      for (const float smoothing : {0.0f, 0.1f}) {
        c.push_back({"cross_entropy_with_gradient_ " + std::string(bf16 ? "bf16 " : "f32 ") +
                         std::to_string(classes) + (smoothing != 0.0f ? " smoothed" : ""),
                     Op::kCrossEntropyWithGradient,
                     [classes, bf16, smoothing](Generator& g, const To& to) {
                       Tensor y = labels(g, 37, classes);
                       y.data<std::int64_t>()[3] = -100;
                       const Tensor x = randn(g, {37, classes});
                       Tensor logits = to(bf16 ? kernels::to_bf16(x) : x);
                       Tensor predicted;
                       const Tensor loss = kernels::cross_entropy_with_gradient_(
                           logits, to(y), smoothing, -100, &predicted);
                       return Outputs{loss, logits, predicted};
                     },
                     bf16 ? bf16_tolerance : 1e-4f});
      }
    }
  }
  // A gradient scaled by a device scalar: by 1 (nothing written), by -2.5; F32 and BF16.
  for (const bool bf16 : {false, true}) {
    c.push_back({std::string("scale_by_ ") + (bf16 ? "bf16" : "f32"), Op::kScaleBy,
                 [bf16](Generator& g, const To& to) {
                   const Tensor x = randn(g, {7, 301});
                   Tensor once = to(bf16 ? kernels::to_bf16(x) : x), twice = once.clone();
                   kernels::scale_by_(once, to(Tensor::scalar(1.0f)));
                   kernels::scale_by_(twice, to(Tensor::scalar(-2.5f)));
                   return Outputs{once, twice};
                 },
                 bf16 ? bf16_tolerance : 1e-6f});
  }
  // A step's gate: a finite loss leaves the flag as it was (0, or 1 from an earlier skip); NaN and
  // either infinity set it.
  c.push_back({"halt_unless_finite_", Op::kHaltUnlessFinite, [](Generator&, const To& to) {
                 const float inf = std::numeric_limits<float>::infinity();
                 Outputs flags;
                 for (const auto& [before, value] : std::vector<std::pair<int, float>>{
                          {0, 2.5f}, {1, 2.5f}, {0, std::nanf("")}, {0, inf}, {0, -inf}}) {
                   Tensor halted = to(Tensor::zeros(Shape{}, DType::I32));
                   if (before != 0) kernels::halt_unless_finite_(halted, to(Tensor::scalar(inf)));
                   kernels::halt_unless_finite_(halted, to(Tensor::scalar(value)));
                   flags.push_back(halted);
                 }
                 return flags;
               }});
  for (bool bf16 : {false, true}) {
    const auto q_of = [bf16](const Tensor& t) { return bf16 ? kernels::to_bf16(t) : t; };
    c.push_back(
        {"attention odd", Op::kAttentionForward,
         [=](Generator& g, const To& to) {
           const Tensor q = q_of(randn(g, {2, 3, 70, 40})), k = q_of(randn(g, {2, 3, 70, 40}));
           const Tensor v = q_of(randn(g, {2, 3, 70, 40}));
           Tensor lse, lse_causal;
           const Tensor y = kernels::attention_forward(to(q), to(k), to(v), false, 0.15f, lse);
           const Tensor yc =
               kernels::attention_forward(to(q), to(k), to(v), true, 0.15f, lse_causal);
           return Outputs{y, lse, yc, lse_causal};
         },
         bf16 ? 2e-2f : 1e-4f});
    c.push_back(
        {"attention_backward odd", Op::kAttentionBackward,
         [=](Generator& g, const To& to) {
           const Tensor q = q_of(randn(g, {2, 3, 70, 40})), k = q_of(randn(g, {2, 3, 70, 40}));
           const Tensor v = q_of(randn(g, {2, 3, 70, 40})), gy = randn(g, {2, 3, 70, 40});
           Tensor lse;
           const Tensor y = kernels::attention_forward(q, k, v, true, 0.15f, lse);
           Tensor gq, gk, gv;
           kernels::attention_backward(to(gy), to(q), to(k), to(v), to(y), to(lse), true, 0.15f,
                                       &gq, &gk, &gv);
           return Outputs{gq, gk, gv};
         },
         bf16 ? 2e-2f : 1e-4f});
  }
  // The CUDA backend's tensor-core attention (head sizes 32, 64, 128; attention_tiled.cu): tiles
  // of 64 rows cut short at both ends, more queries than keys, both maskings.
  for (const std::int64_t d : {32, 64, 128}) {
    const std::string size = " d" + std::to_string(d);
    for (const bool causal : {false, true}) {
      const std::string mask = causal ? " causal" : "";
      c.push_back({"attention bf16 tiles" + size + mask, Op::kAttentionForward,
                   [=](Generator& g, const To& to) {
                     const Tensor q = kernels::to_bf16(randn(g, {2, 3, 150, d}));
                     const Tensor k = kernels::to_bf16(randn(g, {2, 3, 130, d}));
                     const Tensor v = kernels::to_bf16(randn(g, {2, 3, 130, d}));
                     Tensor lse;
                     const Tensor y =
                         kernels::attention_forward(to(q), to(k), to(v), causal, 0.125f, lse);
                     return Outputs{y, lse};
                   },
                   2e-2f});
      c.push_back({"attention_backward bf16 tiles" + size + mask, Op::kAttentionBackward,
                   [=](Generator& g, const To& to) {
                     const Tensor q = kernels::to_bf16(randn(g, {2, 3, 150, d}));
                     const Tensor k = kernels::to_bf16(randn(g, {2, 3, 130, d}));
                     const Tensor v = kernels::to_bf16(randn(g, {2, 3, 130, d}));
                     const Tensor gy = randn(g, {2, 3, 150, d});
                     Tensor lse;
                     const Tensor y = kernels::attention_forward(q, k, v, causal, 0.125f, lse);
                     Tensor gq, gk, gv;
                     kernels::attention_backward(to(gy), to(q), to(k), to(v), to(y), to(lse),
                                                 causal, 0.125f, &gq, &gk, &gv);
                     return Outputs{gq, gk, gv};
                   },
                   2e-2f});
    }
  }
  // Attention over a packed qkv (B, T, 3E): head sizes the CUDA kernels take in place (32, 64,
  // 128), and one they do not (48: the composition there too); gradients in bf16 and in f32.
  for (const auto& [d, heads, causal] : {std::tuple<std::int64_t, std::int64_t, bool>{64, 3, true},
                                         {32, 2, false},
                                         {128, 1, true},
                                         {48, 2, true}}) {
    const std::string what = " d" + std::to_string(d) + (causal ? " causal" : "");
    const std::int64_t e = heads * d;
    c.push_back({"packed_attention_forward_bf16" + what, Op::kPackedAttentionForwardBf16,
                 [=](Generator& g, const To& to) {
                   const Tensor qkv = kernels::to_bf16(randn(g, {2, 150, 3 * e}));
                   Tensor lse;
                   const Tensor y =
                       kernels::packed_attention_forward_bf16(to(qkv), heads, causal, 0.125f, lse);
                   return Outputs{y, lse};
                 },
                 2e-2f});
    for (const DType grad : {DType::BF16, DType::F32}) {
      c.push_back({"packed_attention_backward" + what + " " + dtype_name(grad),
                   Op::kPackedAttentionBackward,
                   [=](Generator& g, const To& to) {
                     const Tensor qkv = kernels::to_bf16(randn(g, {2, 150, 3 * e}));
                     const Tensor gy = randn(g, {2, 150, e});
                     // The CPU's forward for both: the gradients are compared, not the forward.
                     Tensor lse;
                     const Tensor y =
                         kernels::packed_attention_forward_bf16(qkv, heads, causal, 0.125f, lse);
                     return Outputs{kernels::packed_attention_backward(
                         to(gy), to(qkv), to(y), to(lse), heads, causal, 0.125f, grad)};
                   },
                   2e-2f});
    }
  }
  // The output gradient in bf16 (a bf16 product's input gradient, autocast's
  // packed_self_attention_linear): the products' dO as it is, Delta from its values.
  for (const DType grad : {DType::BF16, DType::F32}) {
    c.push_back({std::string("packed_attention_backward bf16 grad_out ") + dtype_name(grad),
                 Op::kPackedAttentionBackward,
                 [=](Generator& g, const To& to) {
                   const Tensor qkv = kernels::to_bf16(randn(g, {2, 150, 3 * 128}));
                   const Tensor gy = kernels::to_bf16(randn(g, {2, 150, 128}));
                   Tensor lse;
                   const Tensor y =
                       kernels::packed_attention_forward_bf16(qkv, 2, true, 0.125f, lse);
                   return Outputs{kernels::packed_attention_backward(
                       to(gy), to(qkv), to(y), to(lse), 2, true, 0.125f, grad)};
                 },
                 2e-2f});
  }
  // Nine key blocks, the last cut short: the CUDA backward's one pass adds each query tile's dq
  // shares in turns over up to nine blocks (ordered_turns.cuh), in both maskings.
  for (const bool causal : {true, false}) {
    c.push_back({std::string("packed_attention_backward d64 t520") + (causal ? " causal" : ""),
                 Op::kPackedAttentionBackward,
                 [=](Generator& g, const To& to) {
                   const Tensor qkv = kernels::to_bf16(randn(g, {1, 520, 3 * 128}));
                   const Tensor gy = randn(g, {1, 520, 128});
                   Tensor lse;
                   const Tensor y =
                       kernels::packed_attention_forward_bf16(qkv, 2, causal, 0.125f, lse);
                   return Outputs{kernels::packed_attention_backward(
                       to(gy), to(qkv), to(y), to(lse), 2, causal, 0.125f, DType::F32)};
                 },
                 2e-2f});
  }
  // out as the bf16 copy autocast keeps of the attention's output.
  c.push_back({"attention_backward bf16 out", Op::kAttentionBackward,
               [](Generator& g, const To& to) {
                 const Tensor q = kernels::to_bf16(randn(g, {2, 3, 150, 64}));
                 const Tensor k = kernels::to_bf16(randn(g, {2, 3, 130, 64}));
                 const Tensor v = kernels::to_bf16(randn(g, {2, 3, 130, 64}));
                 const Tensor gy = randn(g, {2, 3, 150, 64});
                 Tensor lse;
                 const Tensor y =
                     kernels::to_bf16(kernels::attention_forward(q, k, v, true, 0.125f, lse));
                 Tensor gq, gk, gv;
                 kernels::attention_backward(to(gy), to(q), to(k), to(v), to(y), to(lse), true,
                                             0.125f, &gq, &gk, &gv);
                 return Outputs{gq, gk, gv};
               },
               2e-2f});
  c.push_back({"layer_norm wide", Op::kLayerNormForward, [](Generator& g, const To& to) {
                 Tensor sm, sr;
                 const Tensor y =
                     kernels::layer_norm_forward(to(randn(g, {37, 769})), 769, to(randn(g, {769})),
                                                 to(randn(g, {769})), 1e-5f, sm, sr);
                 return Outputs{y, sm, sr};
               }});
  c.push_back({"layer_norm_backward wide", Op::kLayerNormBackward, [](Generator& g, const To& to) {
                 const Tensor x = randn(g, {37, 769}), w = randn(g, {769});
                 Tensor sm, sr;
                 kernels::layer_norm_forward(x, 769, w, randn(g, {769}), 1e-5f, sm, sr);
                 Tensor gx, gw, gb;
                 kernels::layer_norm_backward(to(randn(g, {37, 769})), to(x), 769, to(w), to(sm),
                                              to(sr), &gx, &gw, &gb);
                 return Outputs{gx, gw, gb};
               }});
  // Backward kernels reading the bf16 copy autocast keeps of their input, widened in the kernel.
  for (const std::int64_t width : {std::int64_t{64}, std::int64_t{1100}}) {
    c.push_back({"layer_norm_backward bf16 x " + std::to_string(width), Op::kLayerNormBackward,
                 [width](Generator& g, const To& to) {
                   const Tensor x = kernels::to_bf16(randn(g, {19, width}));
                   const Tensor w = randn(g, {width});
                   Tensor sm, sr;
                   kernels::layer_norm_forward(kernels::to_f32(x), width, w, randn(g, {width}),
                                               1e-5f, sm, sr);
                   Tensor gx, gw, gb;
                   kernels::layer_norm_backward(to(randn(g, {19, width})), to(x), width, to(w),
                                                to(sm), to(sr), &gx, &gw, &gb);
                   return Outputs{gx, gw, gb};
                 }});
  }
  // dx added into a pending gradient (autograd::take_pending_gradient), x f32 and bf16, widths on
  // both sides of the CUDA kernel's warp/block switch (GPT-2's 768 among them); without dw and db;
  // and from a bf16 gradient (a bf16 product's input gradient, autocast's layer_norm_linear),
  // beside the bf16 x and beside an f32 one (which a GPU widens it for).
  for (const std::int64_t width : {std::int64_t{64}, std::int64_t{768}, std::int64_t{1100}}) {
    for (const bool bf16_x : {false, true}) {
      for (const bool bf16_g : {false, true}) {
        c.push_back({"layer_norm_backward into a gradient " + std::to_string(width) +
                         (bf16_x ? " bf16 x" : "") + (bf16_g ? " bf16 gradient" : ""),
                     Op::kLayerNormBackward, [width, bf16_x, bf16_g](Generator& g, const To& to) {
                       const Tensor xf = randn(g, {19, width}), w = randn(g, {width});
                       const Tensor x = bf16_x ? kernels::to_bf16(xf) : xf;
                       Tensor sm, sr;
                       kernels::layer_norm_forward(xf, width, w, randn(g, {width}), 1e-5f, sm, sr);
                       Tensor gx = to(randn(g, {19, width})), gx_only = to(randn(g, {19, width}));
                       Tensor gw, gb;
                       const Tensor gf = randn(g, {19, width});
                       const Tensor gy = to(bf16_g ? kernels::to_bf16(gf) : gf);
                       kernels::layer_norm_backward(gy, to(x), width, to(w), to(sm), to(sr), &gx,
                                                    &gw, &gb);
                       kernels::layer_norm_backward(gy, to(x), width, Tensor(), to(sm), to(sr),
                                                    &gx_only, nullptr, nullptr);
                       return Outputs{gx, gw, gb, gx_only};
                     }});
      }
    }
  }
  // dx's bf16 copy written by the same pass (the residual stream's gradient for the next bf16
  // product), with dx written and with dx added into a gradient: the copy is the sum rounded.
  for (const std::int64_t width : {std::int64_t{64}, std::int64_t{768}, std::int64_t{1100}}) {
    c.push_back({"layer_norm_backward with dx's bf16 copy " + std::to_string(width),
                 Op::kLayerNormBackward,
                 [width](Generator& g, const To& to) {
                   const Tensor xf = randn(g, {19, width}), w = randn(g, {width});
                   Tensor sm, sr;
                   kernels::layer_norm_forward(xf, width, w, randn(g, {width}), 1e-5f, sm, sr);
                   const Tensor x = to(kernels::to_bf16(xf));
                   const Tensor gy = to(kernels::to_bf16(randn(g, {19, width})));
                   Tensor gx, gx_bf16, into = to(randn(g, {19, width})), into_bf16;
                   kernels::layer_norm_backward(gy, x, width, to(w), to(sm), to(sr), &gx, nullptr,
                                                nullptr, &gx_bf16);
                   kernels::layer_norm_backward(gy, x, width, to(w), to(sm), to(sr), &into, nullptr,
                                                nullptr, &into_bf16);
                   return Outputs{gx, gx_bf16, into, into_bf16};
                 },
                 bf16_tolerance});
  }
  c.push_back({"unary_backward gelu bf16 x", Op::kUnaryBackward, [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(randn(g, {7, 301}));
                 return Outputs{kernels::unary_backward(UnaryOp::Gelu, to(randn(g, {7, 301})),
                                                        to(x), Tensor())};
               }});
  // GELU after a product that wrote bf16: its input BF16 forward, its output gradient and input
  // BF16 backward (F32 and BF16 results).
  c.push_back({"unary_bf16 and unary_backward of bf16 gelu", Op::kUnaryBf16,
               [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(randn(g, {7, 301}));
                 const Tensor gy = kernels::to_bf16(randn(g, {7, 301}));
                 Tensor xb;
                 const Tensor y = kernels::unary_bf16(UnaryOp::Gelu, to(x), &xb);
                 return Outputs{
                     y, xb, kernels::unary_backward_bf16(UnaryOp::Gelu, to(gy), to(x), Tensor()),
                     kernels::unary_backward(UnaryOp::Gelu, to(gy), to(x), Tensor())};
               },
               bf16_tolerance});
  // The card's GELU into bf16 and its gradient (PyTorch's erf formulas, rounded in one
  // instruction a pair) over the tails as well, where 1 + erf cancels, two groups a thread.
  c.push_back({"gelu bf16 forward and backward over [-12, 12]", Op::kUnaryBackwardBf16,
               [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(Tensor::uniform({7, 4096}, g, -12.0f, 12.0f));
                 const Tensor gy = kernels::to_bf16(randn(g, {7, 4096}));
                 return Outputs{
                     kernels::unary_bf16(UnaryOp::Gelu, to(x)),
                     kernels::unary_backward_bf16(UnaryOp::Gelu, to(gy), to(x), Tensor())};
               },
               bf16_tolerance});
  c.push_back({"unary_backward_bf16 gelu", Op::kUnaryBackwardBf16,
               [](Generator& g, const To& to) {
                 const Tensor x = kernels::to_bf16(randn(g, {7, 301})), gy = randn(g, {7, 301});
                 const Tensor xf = randn(g, {7, 301});
                 return Outputs{
                     kernels::unary_backward_bf16(UnaryOp::Gelu, to(gy), to(x), Tensor()),
                     kernels::unary_backward_bf16(UnaryOp::Gelu, to(gy), to(xf), Tensor())};
               },
               bf16_tolerance});
  c.push_back({"embedding wide", Op::kEmbeddingBackward, [](Generator& g, const To& to) {
                 std::vector<std::int64_t> idx;
                 for (int i = 0; i < 45; ++i) idx.push_back((i * 7) % 301);
                 const Tensor ix = Tensor::from_i64(idx, Shape{5, 9});
                 Tensor table = to(randn(g, {301, 96}));
                 const Tensor y = kernels::embedding_forward(table, to(ix));
                 kernels::embedding_backward(to(randn(g, {5, 9, 96})), to(ix), table);
                 return Outputs{y, table};
               }});
  // Runs of thousands of positions on a few rows (a frequent character's), a row width across the
  // CUDA kernel's 256-column chunks.
  c.push_back({"embedding long runs", Op::kEmbeddingBackward, [](Generator& g, const To& to) {
                 std::vector<std::int64_t> idx;
                 for (int i = 0; i < 2100; ++i)
                   idx.push_back(i % 7 == 3 ? 5 : (i % 11 == 0 ? 0 : 2));
                 const Tensor ix = Tensor::from_i64(idx, Shape{3, 700});
                 Tensor table = to(randn(g, {7, 300}));
                 kernels::embedding_backward(to(randn(g, {3, 700, 300})), to(ix), table);
                 return Outputs{table};
               }});
  c.push_back({"adam_step_ long", Op::kAdamStep, [](Generator& g, const To& to) {
                 Tensor p = to(randn(g, {100003})), m = to(randn(g, {100003}));
                 Tensor v = to(positive(g, {100003})), vmax;
                 const kernels::AdamStep s{0.9f, 0.95f, 1e-8f, 0.999f, 0.0f, 3e-4f, 0.1f};
                 kernels::adam_step_(s, p, to(randn(g, {100003})), m, v, vmax);
                 return Outputs{p, m, v};
               }});
  // Many parameters in one call: sizes across a block's chunk (8192) and an empty one; 40 tensors
  // (more than one launch's list of 32); clipped (max_norm 0.5 against a norm near 300), not
  // clipped (1e9), and without a norm; gated by a halted flag (the Optimizer's, for clipping), with
  // a finite norm (an update) and a NaN one (nothing changes but the flag).
  for (const char* mode :
       {"clipped", "unclipped", "no norm", "amsgrad clipped", "gated", "gated NaN norm"}) {
    c.push_back({std::string("adam_step_multi_ ") + mode, Op::kAdamStepMulti,
                 [mode = std::string(mode)](Generator& g, const To& to) {
                   std::vector<std::int64_t> sizes = {10, 0, 8193, 20000, 3};
                   for (int i = 0; i < 35; ++i) sizes.push_back(1 + (i * 37) % 300);
                   const bool ams = mode == "amsgrad clipped";
                   std::vector<Tensor> p, gr, m, v, vmax;
                   for (std::int64_t n : sizes) {
                     p.push_back(to(randn(g, {n})));
                     gr.push_back(to(randn(g, {n})));
                     m.push_back(to(randn(g, {n})));
                     v.push_back(to(positive(g, {n})));
                     if (ams) vmax.push_back(to(positive(g, {n})));
                   }
                   const bool gated = mode.rfind("gated", 0) == 0;
                   if (mode == "gated NaN norm") {
                     gr[3] = to(Tensor::from(std::vector<float>(20000, std::nanf("")), {20000}));
                   }
                   const Tensor norm_sq = mode == "no norm" ? Tensor() : kernels::squared_norm(gr);
                   const float max_norm = mode == "unclipped" ? 1e9f : 0.5f;
                   const kernels::AdamStep s{0.9f, 0.95f, 1e-8f, 0.999f, 0.0f, 3e-4f, 0.1f};
                   const Tensor halted = gated ? to(Tensor::zeros(Shape{}, DType::I32)) : Tensor();
                   kernels::adam_step_multi_(s, p, gr, m, v, vmax, norm_sq, max_norm, halted);
                   Outputs out;
                   if (gated) out.push_back(halted);
                   for (const auto* list : {&p, &gr, &m, &v, &vmax})
                     out.insert(out.end(), list->begin(), list->end());
                   return out;
                 }});
  }
  c.push_back({"dropout_mask", Op::kDropoutMask, [](Generator& g, const To& to) {
                 // No input to go by: the current device's.
                 DeviceGuard on(to.device ? *to.device : Device::current());
                 return Outputs{kernels::dropout_mask(Shape{4, 50}, 0.3f, g)};
               }});
  return c;
}

// Values of any dtype as doubles, on the host.
inline std::vector<double> host_values(const Tensor& t) {
  const Tensor h = t.device().is_host() ? t : t.to(Device::cpu());
  // The 16-bit floats widened once (per element, a large output took quadratic time).
  const bool half = h.dtype() == DType::BF16 || h.dtype() == DType::F16;
  const Tensor widened = half ? cpu::to_f32(h) : Tensor();
  std::vector<double> out(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    double v = 0;
    switch (h.dtype()) {
      case DType::F32:
        v = h.data<float>()[i];
        break;
      case DType::F64:
        v = h.data<double>()[i];
        break;
      case DType::I64:
        v = static_cast<double>(h.data<std::int64_t>()[i]);
        break;
      case DType::I32:
        v = h.data<std::int32_t>()[i];
        break;
      case DType::I8:
        v = h.data<std::int8_t>()[i];
        break;
      case DType::U8:
        v = h.data<std::uint8_t>()[i];
        break;
      case DType::BF16:
      case DType::F16:
        v = widened.data<float>()[i];
        break;
    }
    out[static_cast<std::size_t>(i)] = v;
  }
  return out;
}

// Whether d matches the reference w: within tol (absolute, already scaled), or both NaN, or the
// same infinity.
inline bool matches(double w, double d, double tol) {
  if (std::isnan(w) || std::isnan(d)) return std::isnan(w) && std::isnan(d);
  if (std::isinf(w) || std::isinf(d)) return w == d;
  return std::abs(w - d) <= tol;
}

// Runs `c` on the CPU and on `device`, with the same seed. The device's new memory is poisoned
// (NaN bytes), so that an output element a kernel leaves unwritten fails.
inline void check(const Case& c, Device& device) {
  SCOPED_TRACE(c.name + " on " + device.id().str());
  // HPM_BACKEND_CASES=text runs only the cases whose name holds it (a sanitizer's subset).
  if (const char* only = std::getenv("HPM_BACKEND_CASES");
      only != nullptr && c.name.find(only) == std::string::npos) {
    return;
  }
  Generator g_ref(7), g_dev(7);
  const Outputs want = c.run(g_ref, To{});
  Allocator::set_poison(true);
  Outputs got;
  try {
    got = c.run(g_dev, To{&device});
  } catch (...) {
    Allocator::set_poison(false);
    throw;
  }
  Allocator::set_poison(false);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t o = 0; o < want.size(); ++o) {
    SCOPED_TRACE("output " + std::to_string(o));
    ASSERT_TRUE(got[o].defined());
    EXPECT_EQ(got[o].device().id(), device.id()) << "an output left the inputs' device";
    EXPECT_EQ(got[o].shape(), want[o].shape());
    EXPECT_EQ(got[o].dtype(), want[o].dtype());
    const std::vector<double> w = host_values(want[o]), d = host_values(got[o]);
    ASSERT_EQ(w.size(), d.size());
    double scale = 1e-6;
    for (double v : w) {
      if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
      ASSERT_TRUE(matches(w[i], d[i], c.tolerance * scale))
          << "element " << i << " of " << w.size() << ": " << d[i] << ", want " << w[i];
    }
  }
}

}  // namespace hpm::testing::backend_cases
