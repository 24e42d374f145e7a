// Pipelines over models that are not stacks: a GPT cut between its blocks (embeddings, transformer
// blocks, head) trained through every schedule, on threads and on one process per stage, equals
// the unsplit model on one device (1e-4 relative after N SGD steps, as
// tests/distribute/models_test.cpp), with its token embedding and head untied and tied (the tied
// weight's two stages each add their part of its gradient: into one tensor on threads, summed
// across processes).
#include "common/models.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "common/training.h"
#include "hpm/comm/local.h"
#include "hpm/distribute/strategy.h"
#include "hpm/pipeline/strategy.h"
#include "hpm/tensor/kernels.h"

namespace hpm::pipeline {
namespace {

std::shared_ptr<nn::Module> untied_gpt() {
  nn::GPTConfig c = testing::tiny_gpt_config();
  c.tie_weights = false;
  return std::make_shared<nn::GPT>(c);
}

const nn::LanguageModelling objective;

std::vector<float> train(distribute::Strategy& s, const distribute::ModelFactory& model,
                         int steps) {
  manual_seed(7);
  s.scope(model, testing::sgd);
  for (int k = 0; k < steps; ++k) {
    const distribute::StepResult r = s.train_step(
        testing::token_batch(8, 8, 32, 100 + static_cast<std::uint64_t>(k)), objective, 1.0f);
    EXPECT_TRUE(r.finite);
    EXPECT_EQ(r.metrics.count("loss"), 64.0) << "every token counted once, on the last stage";
  }
  s.synchronize();
  return testing::flat_parameters(*s.model());
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b,
                  const std::string& what) {
  testing::expect_same_parameters(a, b, what);
}

TEST(PipelineModels, GptThroughEveryScheduleMatchesOneDevice) {
  for (const bool tied : {false, true}) {
    const distribute::ModelFactory model =
        tied ? distribute::ModelFactory(testing::tiny_gpt) : untied_gpt;
    const auto ref = train(*distribute::make_one_device(), model, 3);
    struct Case {
      ScheduleKind kind;
      int chunks_per_stage;
      const char* name;
    };
    for (const Case& c :
         {Case{ScheduleKind::kGPipe, 1, "gpipe"}, Case{ScheduleKind::kOneFOneB, 1, "1f1b"},
          Case{ScheduleKind::kInterleaved, 2, "interleaved"},
          Case{ScheduleKind::kZeroBubbleH1, 1, "zb-h1"}}) {
      for (PartitionMethod p : {PartitionMethod::kUniform, PartitionMethod::kBalanced}) {
        PipelineStrategyOptions o;
        o.pipeline.stages = 2;
        o.pipeline.micro_batches = 4;
        o.pipeline.schedule = c.kind;
        o.pipeline.chunks_per_stage = c.chunks_per_stage;
        o.partition = p;
        auto s = make_pipeline(o);
        expect_close(ref, train(*s, model, 3),
                     std::string(tied ? "tied, " : "untied, ") + c.name +
                         (p == PartitionMethod::kUniform ? " uniform" : " balanced"));
      }
    }
  }
}

// Under the interleaved schedule each process holds two chunks, so a micro-batch crosses between
// the processes three times each way; under ZB-H1 the weight gradients run apart from the input
// gradients the other process waits for.
TEST(PipelineModels, GptWithOneProcessPerStageMatchesOneDeviceUnderEverySchedule) {
  for (const bool tied : {false, true}) {
    const distribute::ModelFactory model =
        tied ? distribute::ModelFactory(testing::tiny_gpt) : untied_gpt;
    const auto ref = train(*distribute::make_one_device(), model, 3);
    for (const auto& [kind, chunks_per_stage] :
         {std::pair{ScheduleKind::kOneFOneB, 1}, std::pair{ScheduleKind::kInterleaved, 2},
          std::pair{ScheduleKind::kZeroBubbleH1, 1}}) {
      SCOPED_TRACE(std::string(tied ? "tied, " : "untied, ") + schedule_name(kind));
      auto comms = comm::make_local_group(2);
      std::vector<std::vector<float>> got(2);
      testing::on_workers(2, 100, [&](int r) {
        PipelineStrategyOptions o;
        o.pipeline.micro_batches = 4;
        o.pipeline.schedule = kind;
        o.pipeline.chunks_per_stage = chunks_per_stage;
        o.partition = PartitionMethod::kUniform;
        auto s = make_pipeline(o, comms[static_cast<std::size_t>(r)]);
        got[static_cast<std::size_t>(r)] = train(*s, model, 3);
      });
      expect_close(ref, got[0], "stage process 0");
      expect_close(ref, got[1], "stage process 1");
    }
  }
}

// Next-token loss plus sqrt(0): the same finite loss, NaN gradients everywhere (sqrt's backward
// at 0), as a distance loss at distance 0 makes them.
class NanGradients : public nn::Objective {
 public:
  nn::ObjectiveResult compute(const Tensor& outputs, const nn::Batch& batch) const override {
    nn::ObjectiveResult r = objective.compute(outputs, batch);
    r.loss = add(r.loss, sqrt(sum(mul(outputs, 0.0f))));
    return r;
  }
  double weight(const nn::Batch& batch) const override { return objective.weight(batch); }
  std::vector<std::string> metric_names(const nn::Batch& batch) const override {
    return objective.metric_names(batch);
  }
  std::string name() const override { return "nan_gradients"; }
};

// With clipping, the global norm over every stage says the gradients are not finite: no stage
// updates (on threads, or on one process per stage, which all see the reduced norm), and the
// optimizer says so for the Trainer to stop on.
TEST(PipelineModels, NonFiniteGradientsUpdateNoStage) {
  const NanGradients nan_gradients;
  const auto step = [&](distribute::Strategy& s) {
    manual_seed(7);
    s.scope(testing::tiny_gpt, testing::sgd);
    s.synchronize();
    const std::vector<float> before = testing::flat_parameters(*s.model());
    const distribute::StepResult r =
        s.train_step(testing::token_batch(8, 8, 32, 100), nan_gradients, 1.0f);
    EXPECT_TRUE(r.finite) << "the loss itself is finite";
    EXPECT_TRUE(s.optimizer()->updates_halted());
    s.synchronize();
    EXPECT_EQ(testing::flat_parameters(*s.model()), before);
  };
  PipelineStrategyOptions o;
  o.pipeline.micro_batches = 4;
  o.partition = PartitionMethod::kUniform;
  {
    SCOPED_TRACE("threads");
    step(*make_pipeline(o));
  }
  SCOPED_TRACE("one process per stage");
  auto comms = comm::make_local_group(2);
  testing::on_workers(2, 100, [&](int r) { step(*make_pipeline(o, comms[std::size_t(r)])); });
}

// The tied weight really is split in these tests (its two uses on two stages), and clipping by
// the global norm counts its summed gradient once: with a clip that binds, processes and threads
// still equal one device.
TEST(PipelineModels, ATiedWeightOnTwoStagesIsClippedOnce) {
  nn::GPT probe(testing::tiny_gpt_config());
  ASSERT_EQ(probe.head->weight.impl(), probe.tok->weight.impl()) << "tiny_gpt ties its weights";
  const auto run = [](distribute::Strategy& s) {
    manual_seed(7);
    s.scope(testing::tiny_gpt, testing::sgd);
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(s.train_step(testing::token_batch(8, 8, 32, 100 + static_cast<std::uint64_t>(k)),
                               objective, 0.05f)
                      .finite);
    }
    s.synchronize();
    return testing::flat_parameters(*s.model());
  };
  const auto ref = run(*distribute::make_one_device());
  PipelineStrategyOptions o;
  o.pipeline.micro_batches = 4;
  o.partition = PartitionMethod::kUniform;
  auto threads = make_pipeline(o);
  expect_close(ref, run(*threads), "threads");
  ASSERT_NE(pipeline_report(*threads), nullptr);
  const std::vector<int>& cut = pipeline_report(*threads)->partition.boundaries;
  ASSERT_EQ(cut.size(), 3u);
  EXPECT_GT(cut[1], 0) << "the embedding and the head are on different stages";
  auto comms = comm::make_local_group(2);
  std::vector<std::vector<float>> got(2);
  testing::on_workers(2, 100, [&](int r) {
    auto s = make_pipeline(o, comms[static_cast<std::size_t>(r)]);
    got[static_cast<std::size_t>(r)] = run(*s);
  });
  expect_close(ref, got[0], "stage process 0");
  expect_close(ref, got[1], "stage process 1");
}

// BatchNorm normalizes each micro-batch by its own rows: the reference is one device running the
// same micro-batches as gradient accumulation.
TEST(PipelineModels, ResNetThroughEveryScheduleMatchesOneDeviceWithTheSameMicroBatches) {
  const nn::Classification classify;
  const auto run = [&](distribute::Strategy& s) {
    manual_seed(7);
    s.scope(testing::tiny_resnet, testing::sgd);
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(
          s.train_step(testing::image_batch(8, 100 + static_cast<std::uint64_t>(k)), classify, 0.0f)
              .finite);
    }
    return testing::flat_parameters(*s.model());
  };
  distribute::StrategyOptions one;
  one.accumulation_steps = 4;
  const auto ref = run(*distribute::make_one_device(one));
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kInterleaved, ScheduleKind::kZeroBubbleH1}) {
    PipelineStrategyOptions o;
    o.pipeline.micro_batches = 4;
    o.pipeline.schedule = kind;
    // Interleaved: two chunks per stage, one block each (stem, two BasicBlocks, head).
    o.pipeline.chunks_per_stage = kind == ScheduleKind::kInterleaved ? 2 : 1;
    o.partition = PartitionMethod::kBalanced;
    auto s = make_pipeline(o);
    expect_close(ref, run(*s), "resnet, schedule " + std::to_string(static_cast<int>(kind)));
  }
}

// Mixed precision reaches the stages: each runs its forwards and backwards under the bf16
// autocast scope, as the one replica step does, so a pipeline in bf16 equals one device in bf16
// running the same micro-batches (to bf16's rounding), and differs from f32.
TEST(PipelineModels, Bf16StagesMatchOneDeviceInBf16) {
  if (!kernels::native_bf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const nn::Classification classify;
  struct Model {
    const char* name;
    distribute::ModelFactory make;
    std::function<nn::Batch(std::uint64_t)> batch;
    const nn::Objective* objective;
  };
  for (const Model& m :
       {Model{"gpt", testing::tiny_gpt,
              [](std::uint64_t seed) { return testing::token_batch(8, 8, 32, seed); }, &objective},
        Model{"resnet", testing::tiny_resnet,
              [](std::uint64_t seed) { return testing::image_batch(8, seed); }, &classify}}) {
    const auto run = [&](distribute::Strategy& s, autograd::Precision p) {
      manual_seed(7);
      s.set_precision(p);
      s.scope(m.make, testing::sgd);
      for (int k = 0; k < 3; ++k)
        EXPECT_TRUE(
            s.train_step(m.batch(100 + static_cast<std::uint64_t>(k)), *m.objective, 0.0f).finite);
      s.synchronize();
      return testing::flat_parameters(*s.model());
    };
    distribute::StrategyOptions one;
    one.accumulation_steps = 4;
    const auto ref = run(*distribute::make_one_device(one), autograd::Precision::BF16);
    for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved}) {
      PipelineStrategyOptions o;
      o.pipeline.micro_batches = 4;
      o.pipeline.schedule = kind;
      o.pipeline.chunks_per_stage = kind == ScheduleKind::kInterleaved ? 2 : 1;
      o.partition = PartitionMethod::kUniform;
      const auto got = run(*make_pipeline(o), autograd::Precision::BF16);
      testing::expect_same_parameters(ref, got, std::string(m.name) + " bf16 pipeline", 1e-2f);
      EXPECT_NE(got, run(*make_pipeline(o), autograd::Precision::F32))
          << m.name << ": the stages computed in f32";
    }
  }
}

}  // namespace
}  // namespace hpm::pipeline
