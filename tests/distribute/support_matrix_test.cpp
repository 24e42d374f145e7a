// docs/support_matrix.md as tests: every data-parallel strategy (Mirrored, CentralStorage,
// MultiWorkerMirrored) x {f32, bf16} x {plain, gradient accumulation, recomputation, offload} x
// {mlp, cnn, ResNet, GPT} trains as one device does with the same precision and technique.
// R replicas each running k micro-batches are compared with one device running the same batch in
// R x k micro-batches: the same rows meet each BatchNorm, the same weighted gradients. Equal to
// float reassociation in f32; in bf16 to its rounding (a product rounded to bf16 can land on the
// other side of a rounding boundary when its f32 sum was reassociated).
#include <gtest/gtest.h>

#include <thread>

#include "common/models.h"
#include "common/training.h"
#include "hpm/autograd/grad_mode.h"
#include "hpm/autograd/node.h"
#include "hpm/autograd/ops.h"
#include "hpm/comm/local.h"
#include "hpm/distribute/strategy.h"
#include "hpm/nn/containers.h"
#include "hpm/nn/layers.h"
#include "hpm/nn/offload.h"
#include "hpm/nn/recompute.h"
#include "hpm/tensor/kernels.h"

namespace hpm::distribute {
namespace {

using namespace std::chrono_literals;
using autograd::Precision;

struct Model {
  const char* name;
  ModelFactory make;
  std::function<nn::Batch(std::uint64_t)> batch;
  std::shared_ptr<const nn::Objective> objective;
};

std::vector<Model> models() {
  const auto classification = std::make_shared<nn::Classification>();
  return {
      {"mlp", testing::small_model,
       [](std::uint64_t seed) {
         const testing::Batch b = testing::random_batch(8, seed);
         return nn::Batch{b.x, b.y};
       },
       classification},
      {"cnn",
       [] {
         nn::Conv2dOptions conv;
         conv.in_channels = 1;
         conv.out_channels = 4;
         conv.padding = 1;
         return std::shared_ptr<nn::Module>(
             std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                 std::make_shared<nn::Conv2d>(conv), std::make_shared<nn::ReLU>(),
                 std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::Flatten>(),
                 std::make_shared<nn::Linear>(4 * 4 * 4, 4)}));
       },
       [](std::uint64_t seed) { return testing::image_batch(8, seed); }, classification},
      {"resnet", testing::tiny_resnet,
       [](std::uint64_t seed) { return testing::image_batch(8, seed); }, classification},
      {"gpt", testing::tiny_gpt,
       [](std::uint64_t seed) { return testing::token_batch(8, 8, 32, seed); },
       std::make_shared<nn::LanguageModelling>()},
  };
}

enum class Technique { kPlain, kAccumulation, kRecompute, kOffload };

const char* name_of(Technique t) {
  switch (t) {
    case Technique::kPlain:
      return "plain";
    case Technique::kAccumulation:
      return "accumulation";
    case Technique::kRecompute:
      return "recompute";
    case Technique::kOffload:
      return "offload";
  }
  return "?";
}

// The model as the CLI's [memory] section wraps it (every block recomputed, or every activation
// offloaded), under its own names.
std::shared_ptr<nn::Module> with_technique(std::shared_ptr<nn::Module> model, Technique t) {
  if (t != Technique::kRecompute && t != Technique::kOffload) return model;
  std::shared_ptr<nn::Sequential> blocks = nn::as_sequential(model);
  nn::OffloadOptions offload;
  offload.threshold_bytes = 0;  // the fixtures' activations are small: move them all
  std::shared_ptr<nn::Module> runner =
      t == Technique::kOffload
          ? std::shared_ptr<nn::Module>(nn::with_offload(std::move(blocks), offload))
          : nn::with_recomputation(std::move(blocks), 1, nn::RecomputeMode::Always);
  if (std::dynamic_pointer_cast<nn::Sequential>(model)) return runner;
  return std::make_shared<nn::RunAs>(std::move(model), std::move(runner));
}

constexpr int kSteps = 3;

StrategyOptions options(int replicas, int accumulation, Precision p) {
  StrategyOptions o;
  o.replicas = replicas;
  o.threads = replicas;
  o.accumulation_steps = accumulation;
  o.precision = p;
  return o;
}

std::vector<float> train(Strategy& s, const Model& m, Technique t) {
  s.scope([&] { return with_technique(m.make(), t); }, testing::sgd);
  for (int k = 0; k < kSteps; ++k) {
    const StepResult r =
        s.train_step(m.batch(100 + static_cast<std::uint64_t>(k)), *m.objective, 0.0f);
    EXPECT_TRUE(r.finite) << m.name;
  }
  return testing::flat_parameters(*s.model());
}

std::vector<float> one_device(const Model& m, Technique t, int micro_batches, Precision p) {
  manual_seed(7);
  return train(*make_one_device(options(1, micro_batches, p)), m, t);
}

// Two workers of one replica each, on threads (a local group stands in for gloo).
std::vector<float> multi_worker(const Model& m, Technique t, int accumulation, Precision p) {
  auto workers = comm::make_local_group(2, 20s);
  std::vector<std::vector<float>> out(2);
  testing::on_workers(2, 7, [&](int w) {
    auto s = make_multi_worker_mirrored(workers[static_cast<std::size_t>(w)],
                                        options(1, accumulation, p));
    out[static_cast<std::size_t>(w)] = train(*s, m, t);
  });
  EXPECT_EQ(out[0], out[1]) << m.name << ": workers diverged";
  return out[0];
}

void check_every_strategy(Precision p, float tolerance) {
  for (const Model& m : models()) {
    for (Technique t : {Technique::kPlain, Technique::kAccumulation, Technique::kRecompute,
                        Technique::kOffload}) {
      const int k = t == Technique::kAccumulation ? 2 : 1;
      const std::string what =
          std::string(m.name) + " " + autograd::precision_name(p) + " " + name_of(t);
      SCOPED_TRACE(what);
      const std::vector<float> ref = one_device(m, t, 2 * k, p);
      manual_seed(7);
      EXPECT_NE(ref, testing::flat_parameters(*m.make())) << "nothing trained";
      manual_seed(7);
      testing::expect_same_parameters(ref, train(*make_mirrored(options(2, k, p)), m, t),
                                      what + " mirrored", tolerance);
      manual_seed(7);
      testing::expect_same_parameters(ref, train(*make_central_storage(options(2, k, p)), m, t),
                                      what + " central storage", tolerance);
      testing::expect_same_parameters(ref, multi_worker(m, t, k, p),
                                      what + " multi-worker mirrored", tolerance);
    }
  }
}

// Passes its input on, and waits in backward: the all-reduces launched before it have time to
// finish.
class PauseInBackward : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override {
    Tensor y;
    {
      NoGradGuard no_grad;
      y = mul(x, 1.0f);
    }
    return autograd::record("PauseInBackward", {x}, y,
                            [](const Tensor& grad, const std::vector<bool>&) {
                              std::this_thread::sleep_for(50ms);
                              return autograd::Tensors{grad};
                            });
  }
  std::string type_name() const override { return "PauseInBackward"; }
};

// The GPT's token embedding is also its output head: recomputed block by block, its gradient
// arrives in two backwards (the head's segment, then the embedding's). With one bucket per
// parameter the reducer used to launch its all-reduce at the first, while the second was still to
// be added into the same memory: a replica's own embedding gradient then landed on the average,
// and the replicas diverged (here surely: the pause lets the all-reduce finish first).
TEST(SupportMatrix, ATiedWeightRecomputedInTwoSegmentsIsAveragedWhole) {
  Model gpt = models().back();
  gpt.make = [] {
    std::vector<std::shared_ptr<nn::Module>> blocks = testing::tiny_gpt()->blocks();
    blocks.insert(blocks.begin() + 1, std::make_shared<PauseInBackward>());
    return std::shared_ptr<nn::Module>(std::make_shared<nn::Sequential>(blocks));
  };
  const std::vector<float> ref = one_device(gpt, Technique::kRecompute, 2, Precision::F32);
  StrategyOptions o = options(2, 1, Precision::F32);
  o.reducer.bucket_bytes = 1;  // every parameter in a bucket of its own
  manual_seed(7);
  testing::expect_same_parameters(ref, train(*make_mirrored(o), gpt, Technique::kRecompute),
                                  "mirrored, one bucket per parameter");
}

TEST(SupportMatrix, EveryStrategyTechniqueAndModelMatchesOneDeviceInF32) {
  check_every_strategy(Precision::F32, 1e-4f);
}

TEST(SupportMatrix, EveryStrategyTechniqueAndModelMatchesOneDeviceInBf16) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  check_every_strategy(Precision::BF16, 1e-2f);
}

}  // namespace
}  // namespace hpm::distribute
