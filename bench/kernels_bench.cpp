// Micro-benchmarks of the kernels on the cnn's shapes (batch 64), for finding hot spots:
//   build/bench/kernels_bench --benchmark_filter=Relu
#include <benchmark/benchmark.h>

#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm::kernels {
namespace {

void BM_ReluBackward(benchmark::State& st) {
  Generator gen(1);
  Tensor g = Tensor::randn({64, 32, 28, 28}, gen), y = unary(UnaryOp::Relu, Tensor::randn({64, 32, 28, 28}, gen));
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

void BM_Conv2Forward(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 32, 14, 14}, gen), w = Tensor::randn({64, 32, 3, 3}, gen),
         b = Tensor::randn({64}, gen);
  for (auto _ : st) benchmark::DoNotOptimize(conv2d_forward(x, w, b, Conv2dParams{1, 1, 1, 1}));
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * 64 * 196 * 64 * 288 * static_cast<double>(st.iterations()),
                                              benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Conv2Forward);

void BM_Conv2Backward(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 32, 14, 14}, gen), w = Tensor::randn({64, 32, 3, 3}, gen),
         gy = Tensor::randn({64, 64, 14, 14}, gen);
  for (auto _ : st) {
    Tensor gx, gw, gb;
    conv2d_backward(gy, x, w, Conv2dParams{1, 1, 1, 1}, &gx, &gw, &gb);
    benchmark::DoNotOptimize(gx);
  }
  st.counters["GFLOP/s"] = benchmark::Counter(4.0 * 64 * 196 * 64 * 288 * static_cast<double>(st.iterations()),
                                              benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Conv2Backward);

void BM_Conv1Forward(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 1, 28, 28}, gen), w = Tensor::randn({32, 1, 3, 3}, gen),
         b = Tensor::randn({32}, gen);
  for (auto _ : st) benchmark::DoNotOptimize(conv2d_forward(x, w, b, Conv2dParams{1, 1, 1, 1}));
}
BENCHMARK(BM_Conv1Forward);

void BM_Conv1BackwardWeights(benchmark::State& st) {
  Generator gen(1);
  Tensor x = Tensor::randn({64, 1, 28, 28}, gen), w = Tensor::randn({32, 1, 3, 3}, gen),
         gy = Tensor::randn({64, 32, 28, 28}, gen);
  for (auto _ : st) {
    Tensor gw, gb;
    conv2d_backward(gy, x, w, Conv2dParams{1, 1, 1, 1}, nullptr, &gw, &gb);
    benchmark::DoNotOptimize(gw);
  }
}
BENCHMARK(BM_Conv1BackwardWeights);

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
  Tensor x = Tensor::randn({64, 3136}, gen), w = Tensor::randn({128, 3136}, gen), b = Tensor::randn({128}, gen);
  for (auto _ : st) benchmark::DoNotOptimize(linear(x, w, b));
}
BENCHMARK(BM_LinearFc1);

}  // namespace
}  // namespace hpm::kernels

BENCHMARK_MAIN();
