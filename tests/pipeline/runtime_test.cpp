// The pipeline against the unsplit model: every schedule's accumulated gradients equal one
// backward over the whole mini-batch (tolerance: float reassociation of the micro-batch sum,
// 1e-5 relative), N training steps through the pipeline strategy match one device, memory per
// stage comes from Device accounting, and failures surface as errors, not hangs.
#include "hpm/pipeline/runtime.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <utility>

#include "common/training.h"
#include "hpm/autograd/ops.h"
#include "hpm/comm/local.h"
#include "hpm/distribute/strategy.h"
#include "hpm/nn/layers.h"
#include "hpm/pipeline/strategy.h"
#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"

namespace hpm::pipeline {
namespace {

std::shared_ptr<nn::Sequential> mlp(std::uint64_t seed = 5, std::int64_t width = 32) {
  Generator g(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(12, width, true, g), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(width, width, true, g), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(width, width, true, g), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(width, 4, true, g)});
}

using testing::Batch;
using testing::flat_grads;
constexpr auto loss_fn = testing::cross_entropy_loss;
Batch batch(std::int64_t n, std::uint64_t seed) { return testing::random_batch(n, seed); }

void expect_runtime_close(const std::vector<float>& a, const std::vector<float>& b,
                          const std::string& what, float tolerance = 1e-5f) {
  ASSERT_EQ(a.size(), b.size()) << what;
  float worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (1e-3f + std::abs(a[i])));
  EXPECT_LT(worst, tolerance) << what;
}

std::vector<float> unsplit_gradients(const Batch& b, double* loss = nullptr) {
  auto model = mlp();
  Tensor l = loss_fn(model->forward(b.x), b.y);
  if (loss) *loss = l.item();
  l.backward();
  return flat_grads(*model);
}

struct Case {
  ScheduleKind kind;
  int stages, micro, chunks_per_stage;
};

TEST(Pipeline, EveryScheduleAccumulatesTheUnsplitGradients) {
  const Batch b = batch(22, 1);  // 22 rows: micro-batches of unequal size for M = 4 and 8
  double loss = 0;
  const std::vector<float> reference = unsplit_gradients(b, &loss);
  for (const Case& c : std::vector<Case>{{ScheduleKind::kGPipe, 2, 4, 1},
                                         {ScheduleKind::kOneFOneB, 2, 4, 1},
                                         {ScheduleKind::kOneFOneB, 3, 8, 1},
                                         {ScheduleKind::kGPipe, 1, 3, 1},
                                         {ScheduleKind::kInterleaved, 2, 4, 2},
                                         {ScheduleKind::kZeroBubbleH1, 2, 4, 1},
                                         {ScheduleKind::kZeroBubbleH1, 3, 8, 1}}) {
    auto model = mlp();
    const int chunks = c.stages * c.chunks_per_stage;
    std::vector<int> cuts;
    for (int k = 0; k <= chunks; ++k) cuts.push_back(k * 7 / chunks);
    PipelineOptions o;
    o.stages = c.stages;
    o.micro_batches = c.micro;
    o.schedule = c.kind;
    o.chunks_per_stage = c.chunks_per_stage;
    Pipeline p(cut(*model, cuts), o);
    const StepStats st = p.forward_backward(b.x, b.y, loss_fn);
    const std::string what = std::string(schedule_name(c.kind)) + " K=" + std::to_string(c.stages) +
                             " M=" + std::to_string(c.micro);
    expect_runtime_close(reference, flat_grads(*model), what);
    EXPECT_NEAR(st.loss_sum / static_cast<double>(st.rows), loss, 1e-5) << what;
    EXPECT_EQ(st.rows, 22);
    EXPECT_TRUE(st.finite);
    EXPECT_GE(st.bubble, 0.0);
    EXPECT_LT(st.bubble, 1.0);
    ASSERT_EQ(st.chunk_costs.size(), static_cast<std::size_t>(chunks));
    for (const auto& cost : st.chunk_costs) {
      EXPECT_GT(cost.forward_s, 0) << what;
      // Split backwards report their W part; its time is inside backward_s.
      if (c.kind == ScheduleKind::kZeroBubbleH1) {
        EXPECT_GT(cost.weight_s, 0) << what;
        EXPECT_LT(cost.weight_s, cost.backward_s) << what;
      } else {
        EXPECT_EQ(cost.weight_s, 0) << what;
      }
    }
  }
}

// Inputs of 3 x 4 flattened first, then 12 -> 16 -> 16 -> 4: a chunk of the flatten alone (where
// the balanced cut puts Fashion's mlp's) gets inputs that need no gradient, so its output needs
// none, and its stage has no backward to run (nor anything to send back).
std::shared_ptr<nn::Sequential> flattening_mlp(std::uint64_t seed = 5) {
  Generator g(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(12, 16, true, g),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 16, true, g),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4, true, g)});
}

TEST(Pipeline, AFirstChunkWithoutParametersRunsEverySchedule) {
  const Batch b = batch(24, 6);
  const Tensor x = b.x.reshape({24, 3, 4});
  auto whole = flattening_mlp();
  Tensor l = loss_fn(whole->forward(x), b.y);
  const double loss = l.item();
  l.backward();
  const std::vector<float> reference = flat_grads(*whole);
  for (const auto& [c, cuts] : std::vector<std::pair<Case, std::vector<int>>>{
           {{ScheduleKind::kGPipe, 2, 4, 1}, {0, 1, 6}},
           {{ScheduleKind::kOneFOneB, 3, 6, 1}, {0, 1, 3, 6}},
           {{ScheduleKind::kOneFOneB, 4, 8, 1}, {0, 1, 2, 4, 6}},
           {{ScheduleKind::kInterleaved, 2, 4, 2}, {0, 1, 2, 4, 6}},
           {{ScheduleKind::kInterleaved, 3, 6, 2}, {0, 1, 2, 3, 4, 5, 6}},
           {{ScheduleKind::kZeroBubbleH1, 3, 6, 1}, {0, 1, 3, 6}}}) {
    auto model = flattening_mlp();
    PipelineOptions o;
    o.stages = c.stages;
    o.micro_batches = c.micro;
    o.schedule = c.kind;
    o.chunks_per_stage = c.chunks_per_stage;
    Pipeline p(cut(*model, cuts), o);
    const std::string what = std::string(schedule_name(c.kind)) + " K=" + std::to_string(c.stages) +
                             " chunks=" + std::to_string(cuts.size() - 1);
    StepStats st;
    ASSERT_NO_THROW(st = p.forward_backward(x, b.y, loss_fn)) << what;
    expect_runtime_close(reference, flat_grads(*model), what);
    EXPECT_NEAR(st.loss_sum / static_cast<double>(st.rows), loss, 1e-5) << what;
  }
}

std::vector<float> train(distribute::Strategy& s, int steps) {
  s.scope([] { return mlp(9); },
          [](nn::Module& m) {
            return std::make_shared<optim::Adam>(m.named_parameters(), optim::AdamOptions{});
          });
  for (int k = 0; k < steps; ++k) {
    const Batch b = batch(16, 50 + static_cast<std::uint64_t>(k));
    EXPECT_TRUE(s.train_step(b.x, b.y, loss_fn, 1.0f).finite);
  }
  s.synchronize();
  return testing::flat_parameters(*s.model());
}

// The optimizer's state, every buffer flattened in its order, then the step count.
std::vector<float> flat_optimizer_state(const optim::Optimizer& o) {
  std::vector<float> out;
  for (const auto& [name, t] : o.state()) {
    if (t.dtype() == DType::I64) {
      out.push_back(static_cast<float>(t.to_vector_i64().at(0)));
    } else {
      const std::vector<float> v = t.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
  }
  return out;
}

TEST(PipelineStrategy, NStepsMatchOneDeviceForEverySchedule) {
  const std::vector<float> reference = train(*distribute::make_one_device(), 6);
  for (auto [kind, v] :
       std::vector<std::pair<ScheduleKind, int>>{{ScheduleKind::kGPipe, 1},
                                                 {ScheduleKind::kOneFOneB, 1},
                                                 {ScheduleKind::kInterleaved, 2},
                                                 {ScheduleKind::kZeroBubbleH1, 1}}) {
    for (PartitionMethod method : {PartitionMethod::kUniform, PartitionMethod::kBalanced}) {
      PipelineStrategyOptions o;
      o.pipeline.stages = 2;
      o.pipeline.micro_batches = 4;
      o.pipeline.schedule = kind;
      o.pipeline.chunks_per_stage = v;
      o.partition = method;
      auto s = make_pipeline(o);
      expect_runtime_close(reference, train(*s, 6),
                           std::string(schedule_name(kind)) + " " + partition_name(method), 1e-4f);
      const PipelineReport* report = pipeline_report(*s);
      ASSERT_NE(report, nullptr);
      EXPECT_EQ(report->partition.boundaries.size(), static_cast<std::size_t>(2 * v + 1));
    }
  }
}

// The same model trained through the strategy, its first stage the flatten alone (no parameters
// to update): N steps match one device.
TEST(PipelineStrategy, AFirstStageWithoutParametersTrainsAsOneDevice) {
  const auto steps = [](distribute::Strategy& s) {
    s.scope([] { return flattening_mlp(9); },
            [](nn::Module& m) {
              return std::make_shared<optim::Adam>(m.named_parameters(), optim::AdamOptions{});
            });
    for (int k = 0; k < 4; ++k) {
      const Batch b = batch(16, 70 + static_cast<std::uint64_t>(k));
      EXPECT_TRUE(s.train_step(b.x.reshape({16, 3, 4}), b.y, loss_fn, 1.0f).finite);
    }
    s.synchronize();
    return testing::flat_parameters(*s.model());
  };
  const std::vector<float> reference = steps(*distribute::make_one_device());
  PipelineStrategyOptions o;
  o.pipeline.stages = 3;
  o.pipeline.micro_batches = 4;
  o.pipeline.schedule = ScheduleKind::kOneFOneB;
  o.boundaries = {0, 1, 3, 6};
  auto s = make_pipeline(o);
  expect_runtime_close(reference, steps(*s), "1f1b, the flatten alone on stage 0", 1e-4f);
}

TEST(Pipeline, AStepTooLargeForOneDeviceTrainsWhenSplit) {
  const Batch b = batch(256, 3);
  auto peaks = [&](int stages, std::size_t budget) {
    auto model = mlp(5, 96);
    PipelineOptions o;
    o.stages = stages;
    o.micro_batches = 4;
    o.device_budget = budget;
    Pipeline p(cut(*model, stages == 1 ? std::vector<int>{0, 7} : std::vector<int>{0, 3, 7}), o);
    return p.forward_backward(b.x, b.y, loss_fn).peak_bytes;
  };
  const std::size_t whole = peaks(1, Device::kUnlimited)[0];
  const std::vector<std::size_t> split = peaks(2, Device::kUnlimited);
  // A budget each half fits under, which the whole model does not.
  const std::size_t budget = std::max(split[0], split[1]) + 1024;
  ASSERT_GT(whole, budget);
  try {
    peaks(1, budget);
    FAIL() << "expected the budget to be exceeded";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory on device 'stage0'"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("budget of"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0 at "), std::string::npos) << e.what();
  }
  const std::vector<std::size_t> fitted = peaks(2, budget);
  for (std::size_t peak : fitted) EXPECT_LE(peak, budget);
}

// GPipe keeps every micro-batch's activations until the backwards start; 1F1B at most K. Peaks
// are taken on the second step, when gradient buffers exist already (as in training).
TEST(Pipeline, GPipeActivationsGrowWithMicroBatchesAndOneFOneBsDoNot) {
  auto peak_of = [](ScheduleKind kind, int m) {
    auto model = mlp(5, 256);
    PipelineOptions o;
    o.stages = 2;
    o.micro_batches = m;
    o.schedule = kind;
    Pipeline p(cut(*model, {0, 3, 7}), o);
    const Batch b = batch(8 * m, 4);  // 8 rows per micro-batch whatever M
    p.forward_backward(b.x, b.y, loss_fn);
    return p.forward_backward(b.x, b.y, loss_fn).peak_bytes[0];
  };
  const std::size_t g4 = peak_of(ScheduleKind::kGPipe, 4), g16 = peak_of(ScheduleKind::kGPipe, 16);
  const std::size_t f4 = peak_of(ScheduleKind::kOneFOneB, 4),
                    f16 = peak_of(ScheduleKind::kOneFOneB, 16);
  EXPECT_GE(g16, g4 + 12 * 8 * 256 * 4);  // 12 more micro-batches' first-layer outputs at least
  EXPECT_EQ(f16, f4);
  EXPECT_LT(f16, g16);
}

TEST(Pipeline, AFailingStageStopsThePipelineWithItsError) {
  auto model = mlp();
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 2;
  Pipeline p(cut(*model, {0, 3, 7}), o);
  const Batch b = batch(8, 1);
  const Tensor wrong_labels = Tensor::zeros({3}, DType::I64);
  try {
    p.forward_backward(b.x, wrong_labels, loss_fn);
    FAIL();
  } catch (const comm::CommError& e) {
    FAIL() << "the cause was hidden behind " << e.what();
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).find("another stage failed"), std::string::npos);
  }
  EXPECT_THROW(p.forward_backward(b.x, b.y, loss_fn), std::logic_error);  // not reusable
  EXPECT_THROW(
      Pipeline(cut(*mlp(), {0, 3, 7}), o).forward_backward(batch(1, 1).x, batch(1, 1).y, loss_fn),
      std::invalid_argument);  // 1 row cannot make 2 micro-batches
}

TEST(Pipeline, StagesInSeparateCommunicatorsMatchTheInProcessPipeline) {
  // The multi-process constructor, driven here by threads over a local group: the same
  // send/recv path the gloo backend takes between processes.
  const Batch b = batch(12, 2);
  const std::vector<float> reference = unsplit_gradients(b);
  auto comms = comm::make_local_group(2);
  std::vector<std::shared_ptr<nn::Sequential>> models{mlp(), mlp()};
  std::vector<StepStats> stats(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      PipelineOptions o;
      o.stages = 2;
      o.micro_batches = 3;
      Pipeline p(cut(*models[static_cast<std::size_t>(r)], {0, 3, 7}), o,
                 comms[static_cast<std::size_t>(r)]);
      stats[static_cast<std::size_t>(r)] = p.forward_backward(b.x, b.y, loss_fn);
    });
  }
  for (auto& t : threads) t.join();
  // Rank 0 has the first chunk's gradients, rank 1 the second's.
  std::vector<float> combined;
  for (std::size_t i = 0; i < 7; ++i) {
    const auto& model = *models[i < 3 ? 0 : 1];
    for (const auto& p : (*model[i]).parameters()) {
      auto v = p.grad().to_vector();
      combined.insert(combined.end(), v.begin(), v.end());
    }
  }
  expect_runtime_close(reference, combined, "two communicators");
  EXPECT_EQ(stats[0].loss_sum, 0.0);  // the loss lives on the last stage
  EXPECT_GT(stats[1].loss_sum, 0.0);
}

// A stage that stops with a receive still posted (its sender never came) withdraws it: the
// message meant for it, sent later, reaches the next receive of its tag instead of a buffer of a
// Device that no longer exists (under ASan, the group's release of that buffer was a
// use-after-free).
TEST(Pipeline, AStoppedStageWithdrawsItsPostedReceives) {
  auto comms = comm::make_local_group(2, std::chrono::seconds(5));
  {
    PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 2;
    o.timeout = std::chrono::milliseconds(200);
    Pipeline last(cut(*mlp(), {0, 3, 7}), o, comms[1]);
    const Batch b = batch(8, 1);
    EXPECT_THROW(last.forward_backward(b.x, b.y, loss_fn), comm::CommError);
  }
  // Stage 1's first receive: the header (tag 1) of micro-batch 0's activations.
  const std::vector<std::int64_t> shape{2, 4, 32, 0, 0, 0, 0, 0};
  const Tensor header = Tensor::from_i64(shape, {8});
  comms[0]->send(header, 1, 1)->wait();
  Tensor got = Tensor::zeros({8}, DType::I64);
  comms[1]->recv(got, 0, 1)->wait(std::chrono::seconds(2));
  EXPECT_EQ(got.to_vector_i64(), header.to_vector_i64());
}

// Keeps the first 2 columns, then 3, then 2...: an activation whose shape changes from one
// micro-batch to the next (chunks run their micro-batches in order), which a stage receiving
// ahead guesses wrong.
class WidthFollowsData : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override { return narrow(x, 1, 0, 2 + calls_++ % 2); }
  std::string type_name() const override { return "WidthFollowsData"; }

 private:
  int calls_ = 0;
};

class SumColumns : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override { return sum(x, 1, /*keepdim=*/true); }
  std::string type_name() const override { return "SumColumns"; }
};

std::shared_ptr<nn::Sequential> shape_shifting_model() {
  Generator g(3);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(12, 6, true, g), std::make_shared<WidthFollowsData>(),
      std::make_shared<SumColumns>(), std::make_shared<nn::Linear>(1, 4, true, g)});
}

// Stages in two communicators post the receives of a stream's next micro-batch as soon as one
// arrives, guessing its shape. Micro-batches of unequal rows (11 rows in 4: 3, 3, 3, 2), and
// activations whose width changes from one micro-batch to the next, must still arrive whole: the
// gradients equal the micro-batches' weighted sum computed on one model.
TEST(Pipeline, StagesReceivingAheadGetEveryShapeRight) {
  const Batch b = batch(11, 4);
  const int m = 4;
  auto reference_model = shape_shifting_model();
  for (int i = 0; i < m; ++i) {
    const std::int64_t first = i < 3 ? 3 * i : 9, rows = i < 3 ? 3 : 2;
    Tensor l = loss_fn(reference_model->forward(b.x.narrow(first, rows)), b.y.narrow(first, rows));
    (l * (static_cast<float>(rows) / 11.0f)).backward();
  }
  const std::vector<float> reference = flat_grads(*reference_model);

  for (const auto& [kind, chunks_per_stage] :
       {std::pair{ScheduleKind::kOneFOneB, 1}, std::pair{ScheduleKind::kInterleaved, 2}}) {
    SCOPED_TRACE(schedule_name(kind));
    auto comms = comm::make_local_group(2);
    std::vector<std::shared_ptr<nn::Sequential>> models{shape_shifting_model(),
                                                        shape_shifting_model()};
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        PipelineOptions o;
        o.stages = 2;
        o.micro_batches = m;
        o.schedule = kind;
        o.chunks_per_stage = chunks_per_stage;
        const std::vector<int> bounds =
            chunks_per_stage == 1 ? std::vector<int>{0, 2, 4} : std::vector<int>{0, 1, 2, 3, 4};
        Pipeline p(cut(*models[static_cast<std::size_t>(r)], bounds), o,
                   comms[static_cast<std::size_t>(r)]);
        for (int step = 0; step < 2; ++step) {  // nothing of the first step's messages is left over
          models[static_cast<std::size_t>(r)]->zero_grad();
          p.forward_backward(b.x, b.y, loss_fn);
        }
      });
    }
    for (auto& t : threads) t.join();
    // Each rank holds the gradients of its own chunks.
    std::vector<float> combined;
    for (std::size_t i = 0; i < 4; ++i) {
      const int chunk = chunks_per_stage == 1 ? (i < 2 ? 0 : 1) : static_cast<int>(i);
      for (const auto& t : (*models[static_cast<std::size_t>(chunk % 2)])[i]->parameters()) {
        auto v = t.grad().to_vector();
        combined.insert(combined.end(), v.begin(), v.end());
      }
    }
    expect_runtime_close(reference, combined, "received ahead");
  }
}

TEST(Pipeline, TimelineHasOneLanePerStageWithEveryMicroBatch) {
  auto model = mlp();
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.schedule = ScheduleKind::kGPipe;
  Pipeline p(cut(*model, {0, 3, 7}), o);
  const Batch b = batch(16, 1);
  trace::start();
  p.forward_backward(b.x, b.y, loss_fn);
  trace::stop();
  std::map<std::uint64_t, std::vector<std::string>> lanes;
  for (const auto& e : trace::events()) {
    if (e.category == "forward" || e.category == "backward") lanes[e.thread].push_back(e.name);
  }
  ASSERT_EQ(lanes.size(), 2u);
  for (const auto& [thread, names] : lanes) {
    EXPECT_EQ(names, (std::vector<std::string>{"F0", "F1", "F2", "F3", "B3", "B2", "B1", "B0"}));
  }
  EXPECT_NE(trace::svg(trace::events(), "GPipe").find("<title>F2 "), std::string::npos);
}

}  // namespace
}  // namespace hpm::pipeline

namespace hpm::pipeline {
namespace {

// DeferredBatchNorm: micro-batches normalize by their own statistics, but the running statistics
// after a step are those of one forward over the whole mini-batch.
TEST(PipelineStrategy, BatchNormRunningStatisticsAreCommittedOncePerMiniBatch) {
  auto make_model = [] {
    Generator g(2);
    nn::BatchNormOptions bo;
    bo.num_features = 16;
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(12, 16, true, g), std::make_shared<nn::BatchNorm1d>(bo),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(16, 4, true, g)});
  };
  auto opt = [](nn::Module& m) {
    return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.0f, 0.0f});
  };
  const Batch b = batch(20, 8);
  auto one = distribute::make_one_device();
  one->scope(make_model, opt);
  one->train_step(b.x, b.y, loss_fn, 0.0f);
  PipelineStrategyOptions o;
  o.pipeline.micro_batches = 4;
  o.partition = PartitionMethod::kUniform;
  auto piped = make_pipeline(o);
  piped->scope(make_model, opt);
  piped->train_step(b.x, b.y, loss_fn, 0.0f);
  const auto ref = one->model()->named_buffers(), got = piped->model()->named_buffers();
  ASSERT_EQ(ref.size(), 3u);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (ref[i].second.dtype() == DType::I64) {
      EXPECT_EQ(ref[i].second.to_vector_i64(), got[i].second.to_vector_i64()) << ref[i].first;
    } else {
      expect_runtime_close(ref[i].second.to_vector(), got[i].second.to_vector(), ref[i].first);
    }
  }
}

}  // namespace
}  // namespace hpm::pipeline

namespace hpm::pipeline {
namespace {

// One process per stage (here: threads with their own communicators, the path gloo takes):
// after N steps every process holds the whole model, equal to one device's.
TEST(PipelineStrategy, OneProcessPerStageMatchesOneDeviceAndSharesTheModel) {
  const std::vector<float> reference = train(*distribute::make_one_device(), 4);
  auto comms = comm::make_local_group(2);
  std::vector<std::vector<float>> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Generator own(100 + static_cast<std::uint64_t>(r));  // as a process would have its own
      ThreadGeneratorGuard with_own(own);
      PipelineStrategyOptions o;
      o.pipeline.micro_batches = 4;
      o.partition = PartitionMethod::kBalanced;
      auto s = make_pipeline(o, comms[static_cast<std::size_t>(r)]);
      EXPECT_EQ(s->worker_rank(), r);
      got[static_cast<std::size_t>(r)] = train(*s, 4);
    });
  }
  for (auto& t : threads) t.join();
  expect_runtime_close(reference, got[0], "rank 0", 1e-4f);
  EXPECT_EQ(got[0], got[1]);
}

// A step updates only the process's own stage (no broadcast of the model per step); synchronize()
// brings the other stages' weights and their optimizer state (Adam's moments), so that a backup
// written by process 0 continues the run exactly.
TEST(PipelineStrategy, SynchronizeSharesTheOtherStagesWeightsAndOptimizerState) {
  auto one = distribute::make_one_device();
  const std::vector<float> reference = train(*one, 3);
  const std::vector<float> reference_state = flat_optimizer_state(*one->optimizer());
  auto comms = comm::make_local_group(2);
  std::vector<std::vector<float>> before(2), after(2), state(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Generator own(100 + static_cast<std::uint64_t>(r));
      ThreadGeneratorGuard with_own(own);
      PipelineStrategyOptions o;
      o.pipeline.micro_batches = 4;
      o.partition = PartitionMethod::kUniform;
      auto s = make_pipeline(o, comms[static_cast<std::size_t>(r)]);
      s->scope([] { return mlp(9); },
               [](nn::Module& m) {
                 return std::make_shared<optim::Adam>(m.named_parameters(), optim::AdamOptions{});
               });
      for (int k = 0; k < 3; ++k) {
        const Batch b = batch(16, 50 + static_cast<std::uint64_t>(k));
        EXPECT_TRUE(s->train_step(b.x, b.y, loss_fn, 1.0f).finite);
      }
      const auto i = static_cast<std::size_t>(r);
      before[i] = testing::flat_parameters(*s->model());
      s->synchronize();
      after[i] = testing::flat_parameters(*s->model());
      state[i] = flat_optimizer_state(*s->optimizer());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(before[0], before[1]) << "each process updated only its own stage";
  expect_runtime_close(reference, after[0], "rank 0", 1e-4f);
  EXPECT_EQ(after[0], after[1]);
  expect_runtime_close(reference_state, state[0], "rank 0's optimizer state", 1e-4f);
  EXPECT_EQ(state[0], state[1]);
}

}  // namespace
}  // namespace hpm::pipeline

namespace hpm::pipeline {
namespace {

// Recomputation re-runs each chunk's forward in backward: the same gradients, bit for bit, and
// under GPipe (all micro-batches in flight) a lower peak, since only each chunk's input is kept.
TEST(Pipeline, RecomputationChangesNoNumberAndLowersThePeak) {
  const Batch b = batch(64, 6);
  auto run = [&](nn::RecomputeMode mode, std::vector<float>* grads) {
    auto model = mlp(5, 256);
    PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 8;
    o.schedule = ScheduleKind::kGPipe;
    o.recompute = mode;
    Pipeline p(cut(*model, {0, 3, 7}), o);
    p.forward_backward(b.x, b.y, loss_fn);
    for (const auto& t : model->parameters()) t.impl()->autograd->grad.reset();
    const StepStats st = p.forward_backward(b.x, b.y, loss_fn);
    *grads = flat_grads(*model);
    return st.peak_bytes[0];
  };
  std::vector<float> never, always, except_last;
  const std::size_t peak_never = run(nn::RecomputeMode::Never, &never);
  const std::size_t peak_always = run(nn::RecomputeMode::Always, &always);
  run(nn::RecomputeMode::ExceptLast, &except_last);
  EXPECT_EQ(never, always);
  EXPECT_EQ(never, except_last);
  EXPECT_LT(peak_always, peak_never);
}

}  // namespace
}  // namespace hpm::pipeline
