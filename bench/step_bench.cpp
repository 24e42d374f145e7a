// One training step of the peer models (forward, backward, SGD), batch 64, timed in isolation
// from data loading: build/bench/step_bench
#include <benchmark/benchmark.h>

#include "hpm/nn/layers.h"
#include "hpm/optim/optimizer.h"

namespace hpm {
namespace {

std::shared_ptr<nn::Sequential> cnn() {
  nn::Conv2dOptions c1{1, 32, 3, 1, 1, true}, c2{32, 64, 3, 1, 1, true};
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(c1), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
      std::make_shared<nn::Conv2d>(c2), std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(3136, 128), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(128, 10)});
}

std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(784, 512), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(512, 256), std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(256, 10)});
}

void run_steps(benchmark::State& st, const std::shared_ptr<nn::Sequential>& model) {
  Generator gen(1);
  Tensor x = Tensor::uniform({64, 1, 28, 28}, gen, 0.0f, 1.0f);
  std::vector<std::int64_t> labels(64);
  for (auto& l : labels) l = static_cast<std::int64_t>(gen.below(10));
  Tensor y = Tensor::from_i64(labels, {64});
  optim::SGD opt(model->named_parameters(), {0.01f, 0.9f});
  for (auto _ : st) {
    opt.zero_grad();
    Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    opt.step();
  }
  st.counters["samples/s"] = benchmark::Counter(64.0 * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}

void BM_CnnStep(benchmark::State& st) { run_steps(st, cnn()); }
BENCHMARK(BM_CnnStep)->Unit(benchmark::kMillisecond);
void BM_MlpStep(benchmark::State& st) { run_steps(st, mlp()); }
BENCHMARK(BM_MlpStep)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hpm

BENCHMARK_MAIN();
