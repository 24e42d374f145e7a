// optimizer.cu's multi-tensor Adam(W) (optimizer_kernels.cuh: the kernel and the packing of
// parameters into its lists, as adam_step_multi_ launches them), compiled for the CPU and run
// under simt.h's emulation, against the CPU's adam_step_multi_ to the last place (kUlps).
// Sizes around the 8192-element chunks, an empty tensor, more tensors than a list holds, AMSGrad,
// and clipping read from the norm on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emulated/host_values.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/op_params.h"
#include "hpm/tensor/random.h"
#include "hpm/tensor/tensor.h"

// The kernels last: simt.h's macros (threadIdx, __syncthreads, ...) must not reach other headers.
#include <cuda_runtime.h>

#include "cuda_emulated/simt.h"
#define HPM_SIMT_EMULATION 1
#include "tensor/backend/cuda/optimizer_kernels.cuh"

namespace hpm {
namespace {

using emulated::copy_of;

// The kernel rounds each product and sum (no FMA, as on the card); the CPU's clones for FMA-capable
// CPUs contract some. Measured: 1.2e-7 of a tensor's largest magnitude (one unit in its last
// place); an indexing or packing error would be far more.
constexpr float kUlps = 5e-7f;

void run_case(bool ams, bool clip) {
  SCOPED_TRACE(std::string(ams ? "amsgrad" : "adam") + (clip ? " clipped" : ""));
  // 40 tensors (more than a list's 32), of sizes around the chunk of 8192.
  const std::int64_t sizes[] = {5, 8192, 8193, 20000, 0, 3, 16384, 1};
  Generator gen(ams ? 3 : 4);
  std::vector<Tensor> p, g, m, v, vmax;
  for (int i = 0; i < 40; ++i) {
    const std::int64_t n = sizes[i % 8];
    p.push_back(Tensor::randn({n}, gen));
    g.push_back(Tensor::randn({n}, gen));
    m.push_back(Tensor::randn({n}, gen, 0.0f, 0.1f));
    v.push_back(Tensor::uniform({n}, gen, 0.0f, 0.01f));
    if (ams) vmax.push_back(Tensor::uniform({n}, gen, 0.0f, 0.01f));
  }
  const kernels::AdamStep s{0.9f, 0.99f, 1e-8f, 0.999f, 0.0f, 1e-3f, 0.3f};
  const double norm_sq = 400.0;  // a norm of 20, clipped to max_norm 1.5
  const float max_norm = 1.5f;

  // The emulated kernel on copies (made before the CPU's step changes the tensors).
  std::vector<std::vector<float>> ep, eg, em, ev, evmax;
  for (std::size_t i = 0; i < p.size(); ++i) {
    ep.push_back(copy_of(p[i]));
    eg.push_back(copy_of(g[i]));
    em.push_back(copy_of(m[i]));
    ev.push_back(copy_of(v[i]));
    evmax.push_back(ams ? copy_of(vmax[i]) : std::vector<float>());
  }
  int launches = 0;
  const auto launch = [&](const cuda::AdamList& l, unsigned blocks) {
    ++launches;
    simt::launch(blocks, 256, 0, [&] {
      cuda::adam_multi_kernel(s, l, clip ? &norm_sq : nullptr, max_norm, nullptr);
    });
  };
  cuda::AdamPacker packer;
  for (std::size_t i = 0; i < p.size(); ++i) {
    packer.add(ep[i].data(), eg[i].data(), em[i].data(), ev[i].data(),
               ams ? evmax[i].data() : nullptr, static_cast<std::int64_t>(ep[i].size()), launch);
  }
  packer.flush(launch);
  EXPECT_EQ(launches, 2);  // 35 non-empty tensors: a full list of 32, then 3

  Tensor norm;
  if (clip)
    norm = Tensor::from_bytes(std::string(reinterpret_cast<const char*>(&norm_sq), 8), Shape{},
                              DType::F64);
  kernels::adam_step_multi_(s, p, g, m, v, vmax, norm, clip ? max_norm : 0.0f);
  const auto compare = [&](const std::vector<float>& got, const Tensor& want, const char* what,
                           std::size_t i) {
    const std::vector<float> w = copy_of(want);
    ASSERT_EQ(got.size(), w.size()) << what << " " << i;
    float size = 1e-30f;
    for (const float x : w) size = std::max(size, std::abs(x));
    for (std::size_t k = 0; k < w.size(); ++k) {
      const float rel = std::abs(got[k] - w[k]) / size;
      ASSERT_LE(rel, kUlps) << what << " " << i << " [" << k << "]: " << got[k] << " vs " << w[k];
    }
  };
  for (std::size_t i = 0; i < p.size(); ++i) {
    compare(ep[i], p[i], "parameter", i);
    compare(eg[i], g[i], "gradient", i);
    compare(em[i], m[i], "exp_avg", i);
    compare(ev[i], v[i], "exp_avg_sq", i);
    if (ams) compare(evmax[i], vmax[i], "max_exp_avg_sq", i);
  }
}

TEST(AdamMultiEmulated, MatchesTheCpuToItsLastPlace) {
  run_case(false, false);
  run_case(false, true);
  run_case(true, true);
}

// The gate (halted given): a finite norm with halted clear updates as without it; a non-finite
// norm, or halted already set, changes nothing but halted, which becomes 1 - on the emulated card
// and on the CPU alike.
TEST(AdamMultiEmulated, AGatedUpdateChangesNothingAfterANonFiniteNorm) {
  struct Case {
    const char* name;
    double norm_sq;
    int halted_before;
    bool updates;
  };
  const Case cases[] = {{"finite", 400.0, 0, true},
                        {"NaN", std::nan(""), 0, false},
                        {"Inf", HUGE_VAL, 0, false},
                        {"halted before", 400.0, 1, false}};
  const kernels::AdamStep s{0.9f, 0.99f, 1e-8f, 0.999f, 0.0f, 1e-3f, 0.3f};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Generator gen(5);
    std::vector<Tensor> p, g, m, v;
    for (const std::int64_t n : {8193, 7, 20000}) {  // three blocks' worth and more: 1 launch
      p.push_back(Tensor::randn({n}, gen));
      g.push_back(Tensor::randn({n}, gen));
      m.push_back(Tensor::randn({n}, gen, 0.0f, 0.1f));
      v.push_back(Tensor::uniform({n}, gen, 0.0f, 0.01f));
    }
    std::vector<std::vector<float>> before, ep, eg, em, ev;
    for (std::size_t i = 0; i < p.size(); ++i) {
      for (const Tensor* t : {&p[i], &g[i], &m[i], &v[i]}) before.push_back(copy_of(*t));
      ep.push_back(copy_of(p[i]));
      eg.push_back(copy_of(g[i]));
      em.push_back(copy_of(m[i]));
      ev.push_back(copy_of(v[i]));
    }
    int emulated_halted = c.halted_before;
    const auto launch = [&](const cuda::AdamList& l, unsigned blocks) {
      simt::launch(blocks, 256, 0,
                   [&] { cuda::adam_multi_kernel(s, l, &c.norm_sq, 1.5f, &emulated_halted); });
    };
    cuda::AdamPacker packer;
    for (std::size_t i = 0; i < p.size(); ++i) {
      packer.add(ep[i].data(), eg[i].data(), em[i].data(), ev[i].data(), nullptr,
                 static_cast<std::int64_t>(ep[i].size()), launch);
    }
    packer.flush(launch);

    const Tensor norm = Tensor::from_bytes(
        std::string(reinterpret_cast<const char*>(&c.norm_sq), 8), Shape{}, DType::F64);
    const std::int32_t h = c.halted_before;
    const Tensor halted =
        Tensor::from_bytes(std::string(reinterpret_cast<const char*>(&h), 4), Shape{}, DType::I32);
    kernels::adam_step_multi_(s, p, g, m, v, {}, norm, 1.5f, halted);
    const std::int32_t cpu_halted = *halted.data<std::int32_t>();

    EXPECT_EQ(emulated_halted, c.updates ? 0 : 1);
    EXPECT_EQ(cpu_halted, c.updates ? 0 : 1);
    std::size_t k = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      const std::vector<float>* emulated[] = {&ep[i], &eg[i], &em[i], &ev[i]};
      const Tensor* cpu[] = {&p[i], &g[i], &m[i], &v[i]};
      for (int j = 0; j < 4; ++j, ++k) {
        const std::vector<float> got = copy_of(*cpu[j]);
        if (!c.updates) {
          EXPECT_EQ(*emulated[j], before[k]) << "tensor " << i << ", state " << j;
          EXPECT_EQ(got, before[k]) << "tensor " << i << ", state " << j;
          continue;
        }
        ASSERT_EQ(got.size(), emulated[j]->size());
        float size = 1e-30f;
        for (const float x : got) size = std::max(size, std::abs(x));
        for (std::size_t e = 0; e < got.size(); ++e) {
          ASSERT_LE(std::abs((*emulated[j])[e] - got[e]) / size, kUlps)
              << "tensor " << i << ", state " << j << " [" << e << "]";
        }
        if (j == 0) {
          EXPECT_NE(got, before[k]) << "tensor " << i << " was not updated";
        }
      }
    }
  }
}

}  // namespace
}  // namespace hpm

namespace hpm {
namespace {

// A step's gate (halt_unless_finite_kernel): the flag is set by a loss that is not finite or by any
// of the given checks' words that holds a bad position, not by a bad word the step did not issue;
// once set it stays set.
TEST(GateEmulated, AStepsGateHaltsOnItsLossOrItsOwnFailedChecks) {
  unsigned long long words[64];
  for (auto& w : words) w = cuda::kNoError;
  words[5] = 3;  // a failed check of this step
  words[9] = 0;  // another thread's, not given
  struct Case {
    const char* name;
    float loss;
    std::vector<int> checks;
    int before, after;
  };
  const Case cases[] = {{"finite, clear checks", 2.5f, {1, 2}, 0, 0},
                        {"NaN", std::nanf(""), {}, 0, 1},
                        {"Inf", HUGE_VALF, {1}, 0, 1},
                        {"a failed check", 2.5f, {1, 5}, 0, 1},
                        {"another's failed check", 2.5f, {1, 2}, 0, 0},
                        {"set before", 2.5f, {}, 1, 1}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    cuda::GateChecks checks{};
    for (int w : c.checks) checks.word[checks.count++] = w;
    int halted = c.before;
    simt::launch(1, 1, 0,
                 [&] { cuda::halt_unless_finite_kernel(&halted, &c.loss, words, checks); });
    EXPECT_EQ(halted, c.after);
  }
}

}  // namespace
}  // namespace hpm
