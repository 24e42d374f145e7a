// Micro-benchmarks of the kernels on the cnn's shapes (batch 64), for finding hot spots:
//   build/bench/kernels_bench --benchmark_filter=Relu
#include <benchmark/benchmark.h>

#include <string>

#include "hpm/tensor/backend/cpu.h"
#include "hpm/tensor/random.h"

namespace hpm::cpu {
namespace {

void BM_ReluBackward(benchmark::State& st) {
  Generator gen(1);
  Tensor g = Tensor::randn({64, 32, 28, 28}, gen),
         y = unary(UnaryOp::Relu, Tensor::randn({64, 32, 28, 28}, gen));
  for (auto _ : st) benchmark::DoNotOptimize(unary_backward(UnaryOp::Relu, g, Tensor(), y));
  st.SetBytesProcessed(st.iterations() * g.nbytes() * 3);
}
BENCHMARK(BM_ReluBackward);

void BM_ReluBackwardMlp(benchmark::State& st) {
  Generator gen(1);
  Tensor g = Tensor::randn({64, 512}, gen), y = unary(UnaryOp::Relu, Tensor::randn({64, 512}, gen));
  for (auto _ : st) benchmark::DoNotOptimize(unary_backward(UnaryOp::Relu, g, Tensor(), y));
  st.SetBytesProcessed(st.iterations() * g.nbytes() * 3);
}
BENCHMARK(BM_ReluBackwardMlp);

void BM_MaxPool2x2(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 32, 28, 28}, gen), arg;
  for (auto _ : st) benchmark::DoNotOptimize(max_pool2d_forward(x, Pool2dParams{}, arg));
  st.SetBytesProcessed(st.iterations() * x.nbytes());
}
BENCHMARK(BM_MaxPool2x2);

// Each convolution case runs the dispatching entry point (name without suffix: what the engine
// uses, HPM_CONV=im2col switches it) and both implementations explicitly (/im2col, /dnnl), so one
// binary gives the A/B: --benchmark_filter=Conv --benchmark_repetitions=5.
template <typename Fn>
bool register_conv(const char* name, void (*bench)(benchmark::State&, Fn), Fn dispatch, Fn im2col,
                   Fn dnnl) {
  benchmark::RegisterBenchmark(name, bench, dispatch);
  benchmark::RegisterBenchmark((std::string(name) + "/im2col").c_str(), bench, im2col);
  benchmark::RegisterBenchmark((std::string(name) + "/dnnl").c_str(), bench, dnnl);
  return true;
}
using ConvForwardFn = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&);
using ConvBackwardFn = void (*)(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&,
                                Tensor*, Tensor*, Tensor*);

void BM_Conv2Forward(benchmark::State& st, ConvForwardFn fwd) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 32, 14, 14}, gen), w = Tensor::randn({64, 32, 3, 3}, gen),
         b = Tensor::randn({64}, gen);
  for (auto _ : st) benchmark::DoNotOptimize(fwd(x, w, b, Conv2dParams{1, 1, 1, 1}));
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * 64 * 196 * 64 * 288 * static_cast<double>(st.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
const bool kConv2Forward = register_conv("BM_Conv2Forward", BM_Conv2Forward, conv2d_forward,
                                         conv2d_forward_im2col, conv2d_forward_dnnl);

void BM_Conv2Backward(benchmark::State& st, ConvBackwardFn bwd) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 32, 14, 14}, gen), w = Tensor::randn({64, 32, 3, 3}, gen),
         gy = Tensor::randn({64, 64, 14, 14}, gen);
  for (auto _ : st) {
    Tensor gx, gw, gb;
    bwd(gy, x, w, Conv2dParams{1, 1, 1, 1}, &gx, &gw, &gb);
    benchmark::DoNotOptimize(gx);
  }
  st.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * 64 * 196 * 64 * 288 * static_cast<double>(st.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
const bool kConv2Backward = register_conv("BM_Conv2Backward", BM_Conv2Backward, conv2d_backward,
                                          conv2d_backward_im2col, conv2d_backward_dnnl);

void BM_Conv1Forward(benchmark::State& st, ConvForwardFn fwd) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 1, 28, 28}, gen), w = Tensor::randn({32, 1, 3, 3}, gen),
         b = Tensor::randn({32}, gen);
  for (auto _ : st) benchmark::DoNotOptimize(fwd(x, w, b, Conv2dParams{1, 1, 1, 1}));
}
const bool kConv1Forward = register_conv("BM_Conv1Forward", BM_Conv1Forward, conv2d_forward,
                                         conv2d_forward_im2col, conv2d_forward_dnnl);

// The cnn's input needs no gradient, so the first conv's backward is weights and bias only.
void BM_Conv1BackwardWeights(benchmark::State& st, ConvBackwardFn bwd) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 1, 28, 28}, gen), w = Tensor::randn({32, 1, 3, 3}, gen),
         gy = Tensor::randn({64, 32, 28, 28}, gen);
  for (auto _ : st) {
    Tensor gw, gb;
    bwd(gy, x, w, Conv2dParams{1, 1, 1, 1}, nullptr, &gw, &gb);
    benchmark::DoNotOptimize(gw);
  }
}
const bool kConv1BackwardWeights =
    register_conv("BM_Conv1BackwardWeights", BM_Conv1BackwardWeights, conv2d_backward,
                  conv2d_backward_im2col, conv2d_backward_dnnl);

void BM_ReluForward(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 32, 28, 28}, gen);
  for (auto _ : st) benchmark::DoNotOptimize(unary(UnaryOp::Relu, x));
}
BENCHMARK(BM_ReluForward);

void BM_MaxPool2x2Backward(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 32, 28, 28}, gen), arg;
  Tensor y = max_pool2d_forward(x, Pool2dParams{}, arg);
  for (auto _ : st) benchmark::DoNotOptimize(max_pool2d_backward(y, arg, x.shape()));
}
BENCHMARK(BM_MaxPool2x2Backward);

void BM_LinearFc1(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 3136}, gen), w = Tensor::randn({128, 3136}, gen),
         b = Tensor::randn({128}, gen);
  for (auto _ : st) benchmark::DoNotOptimize(linear(x, w, b));
}
BENCHMARK(BM_LinearFc1);

// The bf16 fusions on the shakespeare GPT's shapes (B x T = 64 x 256 rows; GELU over the fc
// output, 4 x 384 wide; layer norm over 384): /fused is the op, /composed what it replaced (the
// f32 op, then its roundings), one binary for the A/B: --benchmark_filter=Bf16
// --benchmark_repetitions=5 --benchmark_report_aggregates_only=true.
void BM_GeluBf16(benchmark::State& st, bool fused) {
  Generator gen(1);
  const Tensor x = Tensor::randn({16384, 1536}, gen);
  for (auto _ : st) {
    Tensor xb;
    if (fused) {
      benchmark::DoNotOptimize(unary_bf16(UnaryOp::Gelu, x, &xb));
    } else {
      benchmark::DoNotOptimize(to_bf16(unary(UnaryOp::Gelu, x)));
      benchmark::DoNotOptimize(xb = to_bf16(x));
    }
  }
}
BENCHMARK_CAPTURE(BM_GeluBf16, fused, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GeluBf16, composed, false)->Unit(benchmark::kMillisecond);

void BM_GeluBackwardBf16(benchmark::State& st, bool fused) {
  Generator gen(1);
  const Tensor g = Tensor::randn({16384, 1536}, gen),
               xb = to_bf16(Tensor::randn({16384, 1536}, gen));
  for (auto _ : st) {
    if (fused) {
      benchmark::DoNotOptimize(unary_backward_bf16(UnaryOp::Gelu, g, xb, Tensor()));
    } else {
      benchmark::DoNotOptimize(to_bf16(unary_backward(UnaryOp::Gelu, g, to_f32(xb), Tensor())));
    }
  }
}
BENCHMARK_CAPTURE(BM_GeluBackwardBf16, fused, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_GeluBackwardBf16, composed, false)->Unit(benchmark::kMillisecond);

void BM_LayerNormBf16(benchmark::State& st, bool fused) {
  Generator gen(1);
  const Tensor x = Tensor::randn({16384, 384}, gen), w = Tensor::randn({384}, gen),
               b = Tensor::randn({384}, gen);
  for (auto _ : st) {
    Tensor m, r, xb;
    if (fused) {
      benchmark::DoNotOptimize(layer_norm_forward_bf16(x, 384, w, b, 1e-5f, m, r, &xb));
    } else {
      benchmark::DoNotOptimize(to_bf16(layer_norm_forward(x, 384, w, b, 1e-5f, m, r)));
      benchmark::DoNotOptimize(xb = to_bf16(x));
    }
  }
}
BENCHMARK_CAPTURE(BM_LayerNormBf16, fused, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LayerNormBf16, composed, false)->Unit(benchmark::kMillisecond);

void BM_LayerNormBackwardBf16(benchmark::State& st, bool fused) {
  Generator gen(1);
  const Tensor x = Tensor::randn({16384, 384}, gen), w = Tensor::randn({384}, gen);
  const Tensor g = Tensor::randn({16384, 384}, gen), xb = to_bf16(x);
  Tensor m, r;
  layer_norm_forward(x, 384, w, Tensor(), 1e-5f, m, r);
  for (auto _ : st) {
    Tensor gx, gw, gb;
    layer_norm_backward(g, fused ? xb : to_f32(xb), 384, w, m, r, &gx, &gw, &gb);
    benchmark::DoNotOptimize(gx);
  }
}
BENCHMARK_CAPTURE(BM_LayerNormBackwardBf16, fused, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_LayerNormBackwardBf16, composed, false)->Unit(benchmark::kMillisecond);

// A Linear's input gradient under bf16 autocast on the shakespeare GPT's shapes (16384 rows,
// dx = g W over the fc's 1536 and the projections' 384): /bf16 is the product rounding as it
// writes (oneDNN's bf16 destination), /f32 what it replaced (an F32 result). And the layer norm's
// backward reading that gradient in bf16 (/bf16, widened a block at a time) or in f32: the A/B of
// issue 32's bf16 input gradients on the CPU: --benchmark_filter='InputGradient|NormBackwardFrom'.
void BM_InputGradient(benchmark::State& st, DType out) {
  Generator gen(1);
  const std::int64_t inner = st.range(0);
  const Tensor g = to_bf16(Tensor::randn({16384, inner}, gen));
  const Tensor w = to_bf16(Tensor::randn({inner, 384}, gen));
  for (auto _ : st) benchmark::DoNotOptimize(matmul_bf16(g, w, false, false, out == DType::BF16));
}
BENCHMARK_CAPTURE(BM_InputGradient, bf16, DType::BF16)
    ->Arg(384)
    ->Arg(1536)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_InputGradient, f32, DType::F32)
    ->Arg(384)
    ->Arg(1536)
    ->Unit(benchmark::kMillisecond);

void BM_NormBackwardFromGradient(benchmark::State& st, DType grad) {
  Generator gen(1);
  const Tensor x = Tensor::randn({16384, 384}, gen), w = Tensor::randn({384}, gen);
  const Tensor g32 = Tensor::randn({16384, 384}, gen), xb = to_bf16(x);
  const Tensor g = grad == DType::BF16 ? to_bf16(g32) : g32;
  Tensor m, r;
  layer_norm_forward(x, 384, w, Tensor(), 1e-5f, m, r);
  for (auto _ : st) {
    Tensor gx, gw, gb;
    layer_norm_backward(g, xb, 384, w, m, r, &gx, &gw, &gb);
    benchmark::DoNotOptimize(gx);
  }
}
BENCHMARK_CAPTURE(BM_NormBackwardFromGradient, bf16, DType::BF16)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_NormBackwardFromGradient, f32, DType::F32)->Unit(benchmark::kMillisecond);

// Cross-entropy on a GPT's classifier with GPT-2's vocabulary (768 rows of 50304 logits, the
// default fortunes model's batch): the forward in f32 and bf16, with the prediction token
// accuracy reads, and the bf16 gradient.
struct ClassifierRows {
  Tensor logits, logits_bf16, labels, stats;
  ClassifierRows() {
    Generator gen(1);
    logits = Tensor::randn({768, 50304}, gen);
    logits_bf16 = to_bf16(logits);
    std::vector<std::int64_t> y;
    for (std::int64_t i = 0; i < 768; ++i) y.push_back((i * 7919) % 50304);
    labels = Tensor::from_i64(y, Shape{768});
    cross_entropy_forward(logits, labels, 0.0f, stats);
  }
};

void BM_CrossEntropyForward(benchmark::State& st, bool bf16, bool predict) {
  const ClassifierRows c;
  for (auto _ : st) {
    Tensor stats, predicted;
    benchmark::DoNotOptimize(cross_entropy_forward(bf16 ? c.logits_bf16 : c.logits, c.labels, 0.0f,
                                                   stats, -100, predict ? &predicted : nullptr));
  }
}
BENCHMARK_CAPTURE(BM_CrossEntropyForward, f32, false, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CrossEntropyForward, bf16, true, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_CrossEntropyForward, bf16_predicting, true, true)
    ->Unit(benchmark::kMillisecond);

void BM_CrossEntropyBackwardBf16(benchmark::State& st) {
  const ClassifierRows c;
  for (auto _ : st) {
    benchmark::DoNotOptimize(cross_entropy_backward(c.logits_bf16, c.stats, c.labels, 0.0f, 1.0f,
                                                    -100, false, DType::BF16));
  }
}
BENCHMARK(BM_CrossEntropyBackwardBf16)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hpm::cpu

BENCHMARK_MAIN();
