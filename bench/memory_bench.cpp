// Step time and device peak of the repository's cnn and mlp (examples/fashion_{cnn,mlp}.toml) and
// of the GPT (examples/fortunes_gpt.toml at nanoGPT's shakespeare_char size, block 256 and 512)
// trained plainly, with recomputation (every 1, 2 and sqrt(n) units; a GPT block is one unit) and
// with offload; ratios against plain measured side by side: each round times every variant once,
// in turn, and the ratio reported is the median over rounds of (variant / plain) for that round.
//
//   flock /tmp/hpm-cpu.lock build/bench/memory_bench [rounds=7] [steps=5] [batch=256]
//   [mlp|cnn|both|deep|gpt]
// (steps: per timing of the cnn; the mlp's are 10 times as many, the GPT's a fifth; batch: images,
// the GPT takes 16 windows, as torch_gpt.py's 10.8M configuration)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "hpm/autograd/autocast.h"
#include "hpm/config/config.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/objective.h"
#include "hpm/nn/offload.h"
#include "hpm/nn/recompute.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/device.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"

namespace hpm {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Variant {
  std::string name;
  std::function<std::shared_ptr<nn::Module>(std::shared_ptr<nn::Sequential>)> wrap;
  autograd::Precision precision = autograd::Precision::F32;
  // State, kept across rounds.
  std::unique_ptr<Device> device;
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<nn::OffloadedSequential> offloaded;
  std::unique_ptr<optim::SGD> opt;
  Tensor x, y;  // the batch, on this variant's device (kernels allocate next to their inputs)
  std::vector<double> step_seconds, ratios;
  std::size_t peak_bytes = 0, resident_bytes = 0, held_bytes = 0;
};

using Factory = std::function<std::shared_ptr<nn::Sequential>()>;

// One batch and the objective that scores the model's outputs on it.
struct Workload {
  Tensor x, y;
  std::shared_ptr<const nn::Objective> objective;
};

Workload images(std::int64_t batch) {
  Generator gen(1);
  const Tensor x = Tensor::uniform({batch, 1, 28, 28}, gen, 0.0f, 1.0f);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(batch));
  for (auto& l : labels) l = static_cast<std::int64_t>(gen.below(10));
  return {x, Tensor::from_i64(labels, {batch}), std::make_shared<nn::Classification>()};
}

// Random byte windows: next-token targets are the inputs shifted by one.
Workload tokens(std::int64_t rows, std::int64_t block) {
  Generator gen(1);
  std::vector<std::int64_t> w(static_cast<std::size_t>(rows * (block + 1)));
  for (auto& t : w) t = static_cast<std::int64_t>(gen.below(256));
  std::vector<std::int64_t> x, y;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = w.begin() + r * (block + 1);
    x.insert(x.end(), row, row + block);
    y.insert(y.end(), row + 1, row + block + 1);
  }
  return {Tensor::from_i64(x, {rows, block}), Tensor::from_i64(y, {rows, block}),
          std::make_shared<nn::LanguageModelling>()};
}

int run(const std::string& config_path, const Factory& build, int rounds, int steps,
        const Workload& work) {
  const Tensor& x = work.x;
  const Tensor& y = work.y;
  const std::int64_t batch = x.size(0);

  std::vector<Variant> variants;
  auto add = [&](std::string name, decltype(Variant::wrap) wrap) {
    Variant v;
    v.name = std::move(name);
    v.wrap = std::move(wrap);
    variants.push_back(std::move(v));
  };
  add("plain", [](auto m) { return std::shared_ptr<nn::Module>(m); });
  add("recompute every 1",
      [](auto m) { return nn::with_recomputation(m, 1, nn::RecomputeMode::Always); });
  add("recompute every 2",
      [](auto m) { return nn::with_recomputation(m, 2, nn::RecomputeMode::Always); });
  add("recompute except_last 2",
      [](auto m) { return nn::with_recomputation(m, 2, nn::RecomputeMode::ExceptLast); });
  // Chen et al.'s choice: segments of sqrt(n) units, the last one kept (it is backward's first).
  add("recompute except_last sqrt(n)", [](auto m) {
    const auto units = static_cast<double>(nn::sequential_units(*m).size());
    const int every = std::max(1, static_cast<int>(std::ceil(std::sqrt(units))));
    return nn::with_recomputation(m, every, nn::RecomputeMode::ExceptLast);
  });
  add("offload >= 64 KiB",
      [](auto m) { return std::shared_ptr<nn::Module>(nn::with_offload(m, {64 << 10})); });
  // Mixed precision ([train] precision = "bf16"): products in bf16, activations saved in bf16.
  if (kernels::native_bf16()) {
    add("plain bf16", [](auto m) { return std::shared_ptr<nn::Module>(m); });
    variants.back().precision = autograd::Precision::BF16;
  }
  for (auto& v : variants) {
    v.device = std::make_unique<Device>(v.name);
    DeviceGuard guard(*v.device);
    manual_seed(0);
    v.model = v.wrap(build());
    v.offloaded = std::dynamic_pointer_cast<nn::OffloadedSequential>(v.model);
    v.x = Tensor::empty(x.shape(), x.dtype(), *v.device);
    v.x.copy_(x);
    v.y = Tensor::empty(y.shape(), DType::I64, *v.device);
    v.y.copy_(y);
    v.opt =
        std::make_unique<optim::SGD>(v.model->named_parameters(), optim::SgdOptions{0.01f, 0.9f});
  }
  auto one_step = [&](Variant& v) {
    autograd::AutocastScope precision(v.precision);
    v.opt->zero_grad();
    Tensor loss = work.objective->compute(v.model->forward(v.x), {v.x, v.y}).loss;
    loss.backward();
    v.opt->step();
  };
  for (auto& v : variants) {  // warm-up (optimizer state, caches), then one step for the peak
    DeviceGuard guard(*v.device);
    one_step(v);
    one_step(v);
    v.opt->zero_grad();
    v.resident_bytes = v.device->stats().current_bytes;
    v.device->reset_peak();
    one_step(v);
    v.peak_bytes = v.device->stats().peak_bytes;
    // What forward leaves on the device for backward (activations): the memory these techniques
    // trade for time. The step's peak may sit elsewhere (gradients, convolution workspaces).
    v.opt->zero_grad();
    {
      autograd::AutocastScope precision(v.precision);
      Tensor loss = work.objective->compute(v.model->forward(v.x), {v.x, v.y}).loss;
      v.held_bytes = v.device->stats().current_bytes - v.resident_bytes;
      loss.backward();
    }
  }
  double prefetch0 = 0, wait0 = 0;
  for (auto& v : variants) {
    if (v.offloaded) {
      prefetch0 = v.offloaded->stats().prefetch_seconds;
      wait0 = v.offloaded->stats().wait_seconds;
    }
  }
  for (int r = 0; r < rounds; ++r) {
    for (auto& v : variants) {
      DeviceGuard guard(*v.device);
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) one_step(v);
      v.step_seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps);
    }
    for (auto& v : variants)
      v.ratios.push_back(v.step_seconds.back() / variants[0].step_seconds.back());
  }
  std::printf("\n%s, batch %lld%s, %d rounds x %d steps, %d thread(s)\n", config_path.c_str(),
              static_cast<long long>(batch),
              x.dim() == 2 ? (" x block " + std::to_string(x.size(1))).c_str() : "", rounds, steps,
              num_threads());
  std::printf("%-30s %9s %8s %15s %8s %17s %8s\n", "variant", "step ms", "time x", "step peak MiB",
              "peak x", "held for bwd MiB", "held x");
  const double plain_need =
      static_cast<double>(variants[0].peak_bytes - variants[0].resident_bytes);
  const double plain_held = static_cast<double>(variants[0].held_bytes);
  for (auto& v : variants) {
    const double need = static_cast<double>(v.peak_bytes - v.resident_bytes);
    const double held = static_cast<double>(v.held_bytes);
    std::printf("%-30s %9.2f %8.3f %15.2f %8.3f %17.2f %8.3f\n", v.name.c_str(),
                1e3 * median(v.step_seconds), median(v.ratios), need / (1024.0 * 1024.0),
                need / plain_need, held / (1024.0 * 1024.0), held / plain_held);
  }
  for (auto& v : variants) {
    if (!v.offloaded) continue;
    const nn::OffloadStats st = v.offloaded->stats();
    const double prefetch = st.prefetch_seconds - prefetch0, wait = st.wait_seconds - wait0;
    const int timed = rounds * steps;
    std::printf(
        "offload: %.2f MiB to host per step; per step %.2f ms copying to host (in forward), "
        "%.2f ms copying back, %.2f ms of backward waiting for it (%.1f unit copies per step done "
        "by backward itself)\n",
        static_cast<double>(st.bytes_offloaded) / (1024.0 * 1024.0) / (timed + 4),
        1e3 * st.offload_seconds / (timed + 4), 1e3 * prefetch / timed, 1e3 * wait / timed,
        static_cast<double>(st.copied_by_backward) / (timed + 4));
  }
  return 0;
}

}  // namespace
}  // namespace hpm

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  const std::int64_t batch = argc > 3 ? std::atoll(argv[3]) : 256;
  const std::string which = argc > 4 ? argv[4] : "both";  // mlp | cnn | both | deep
  // One kernel thread: the other core is left to offload's prefetch thread (and the figures are
  // steadier on a machine whose cores are shared).
  hpm::set_num_threads(1);
  const std::string root = HPM_SOURCE_DIR;
  // The mlp's step is ~20x shorter than the cnn's: more steps per timing, against timer noise.
  auto from_config = [](const std::string& path) {
    return [cfg = hpm::config::load_config(path)] {
      return hpm::nn::as_sequential(hpm::config::build_model(cfg));
    };
  };
  const std::string mlp = root + "/examples/fashion_mlp.toml",
                    cnn = root + "/examples/fashion_cnn.toml";
  if (which == "mlp" || which == "both")
    hpm::run(mlp, from_config(mlp), rounds, 10 * steps, hpm::images(batch));
  if (which == "cnn" || which == "both")
    hpm::run(cnn, from_config(cnn), rounds, steps, hpm::images(batch));
  // The seeds' case: a transformer, whose attention and MLP activations grow with the block.
  if (which == "gpt") {
    for (const int block : {256, 512}) {
      const std::string gpt = root + "/examples/fortunes_gpt.toml";
      const std::vector<std::string> size = {"model.n_layer=6", "model.n_head=6",
                                             "model.n_embd=384",
                                             "model.block_size=" + std::to_string(block)};
      auto build = [cfg = hpm::config::load_config(gpt, size)] {
        return hpm::nn::as_sequential(hpm::config::build_model(cfg));
      };
      hpm::run(gpt + " (6 x 384, block " + std::to_string(block) + ")", build, rounds,
               std::max(1, steps / 5), hpm::tokens(16, block));
    }
  }
  // Deep and narrow, where what forward keeps for backward, not one wide layer's backward or a
  // convolution's workspace, sets the peak: 12 x (Linear(512, 512), ReLU) after Flatten and a
  // Linear(784, 512), and a Linear(512, 10).
  if (which == "deep") {
    hpm::run(
        "deep mlp (12 x 512)",
        [] {
          auto m = std::make_shared<hpm::nn::Sequential>();
          m->push_back(std::make_shared<hpm::nn::Flatten>());
          m->push_back(std::make_shared<hpm::nn::Linear>(784, 512));
          for (int i = 0; i < 12; ++i) {
            m->push_back(std::make_shared<hpm::nn::ReLU>());
            m->push_back(std::make_shared<hpm::nn::Linear>(512, 512));
          }
          m->push_back(std::make_shared<hpm::nn::ReLU>());
          m->push_back(std::make_shared<hpm::nn::Linear>(512, 10));
          return m;
        },
        rounds, 2 * steps, hpm::images(batch));
  }
  return 0;
}
