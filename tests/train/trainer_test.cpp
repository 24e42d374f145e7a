#include "hpm/train/trainer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/blobs.h"
#include "common/temp_dir.h"
#include "common/training.h"
#include "hpm/io/error.h"
#include "hpm/nn/gpt.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"
#include "hpm/train/callbacks.h"

namespace hpm::train {
namespace {

using hpm::testing::blobs;
using hpm::testing::TempDir;

struct Rig {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<optim::SGD> opt;
  std::unique_ptr<Trainer> trainer;
};

Rig make(std::uint64_t seed = 1) {
  manual_seed(seed);
  Rig s;
  s.model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.1f), std::make_shared<nn::Linear>(16, 3)});
  s.opt = std::make_shared<optim::SGD>(s.model->named_parameters(), optim::SgdOptions{0.05f, 0.9f});
  s.trainer = std::make_unique<Trainer>(s.model, s.opt);
  return s;
}

std::vector<float> flat_params(const nn::Module& m) {
  std::vector<float> out;
  for (auto& p : m.parameters()) {
    auto v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

class StopAt : public Callback {
 public:
  explicit StopAt(std::int64_t step) : step_(step) {}
  void on_batch_end(Trainer& t, const BatchLogs& b) override {
    if (b.global_step == step_) t.stop_training();
  }

 private:
  std::int64_t step_;
};

TEST(Trainer, LearnsASeparableProblem) {
  auto train = blobs(600, 1), test = blobs(300, 2);
  Rig s = make();
  FitOptions o;
  o.epochs = 5;
  o.batch_size = 32;
  FitResult r = s.trainer->fit(train, &test, o);
  ASSERT_EQ(r.history.size(), 5u);
  EXPECT_GT(r.history.back().test_accuracy, 0.9);
  EXPECT_LT(r.history.back().train_loss, r.history.front().train_loss);
  EXPECT_EQ(r.steps, 5 * (600 / 32));
}

TEST(Trainer, ResumeMidEpochIsBitIdentical) {
  auto train = blobs(200, 3);
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 16;
  o.seed = 7;

  Rig straight = make();
  straight.trainer->fit(train, nullptr, o);

  TempDir dir;
  Rig first = make();
  first.trainer->add_callback(std::make_shared<StopAt>(17));  // mid-epoch 2 (12 steps/epoch)
  FitOptions o1 = o;
  o1.checkpoint_dir = dir.path();
  FitResult r1 = first.trainer->fit(train, nullptr, o1);
  EXPECT_EQ(r1.steps, 17);
  ASSERT_FALSE(r1.last_checkpoint.empty());

  Rig second = make(99);  // different init: everything must come from the checkpoint
  FitOptions o2 = o;
  o2.resume_from = dir.path();
  FitResult r2 = second.trainer->fit(train, nullptr, o2);
  EXPECT_EQ(r2.steps, 3 * 12 - 17);
  EXPECT_EQ(flat_params(*second.model), flat_params(*straight.model));
}

// Under Mirrored each replica draws its dropout masks from its own generator: a checkpoint saves
// them beside the default one, so a resumed run trains as an uninterrupted one. They were not
// saved: the resumed replicas drew their first masks again, and the parameters differed.
TEST(Trainer, ResumeMidEpochUnderMirroredWithDropoutIsBitIdentical) {
  auto train = blobs(200, 3);
  const auto mirrored = [](std::uint64_t init) {
    distribute::StrategyOptions so;
    so.replicas = 2;
    auto strategy = distribute::make_mirrored(so);
    manual_seed(init);
    strategy->scope(
        [] {
          return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
              std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
              std::make_shared<nn::Dropout>(0.1f), std::make_shared<nn::Linear>(16, 3)});
        },
        [](nn::Module& m) {
          return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.05f, 0.9f});
        });
    return strategy;
  };
  FitOptions o;
  o.epochs = 3;
  o.batch_size = 16;
  o.seed = 7;
  auto straight = mirrored(1);
  Trainer(straight).fit(train, nullptr, o);

  TempDir dir;
  auto first = mirrored(1);
  Trainer stopped(first);
  stopped.add_callback(std::make_shared<StopAt>(17));  // mid-epoch 2 (12 steps an epoch)
  FitOptions o1 = o;
  o1.checkpoint_dir = dir.path();
  EXPECT_EQ(stopped.fit(train, nullptr, o1).steps, 17);
  EXPECT_EQ(read_checkpoint_state(dir.path()).replica_rngs.size(), 2u);

  auto second = mirrored(99);  // another initialization: everything comes from the checkpoint
  FitOptions o2 = o;
  o2.resume_from = dir.path();
  EXPECT_EQ(Trainer(second).fit(train, nullptr, o2).steps, 3 * 12 - 17);
  EXPECT_EQ(flat_params(*second->model()), flat_params(*straight->model()));
}

// The epoch's training loss is the mean over its rows, as Keras' and the epoch's line: the mean
// over batches weighted a short last batch (44 rows of 300) as a whole one (256).
TEST(Trainer, TheEpochsLossIsWeightedByRows) {
  auto train = blobs(300, 3);
  Rig s = make();
  FitOptions o;
  o.batch_size = 256;
  o.drop_last = false;
  o.shuffle = false;
  std::vector<double> batch_losses;
  struct Losses : Callback {
    std::vector<double>* out;
    explicit Losses(std::vector<double>* o) : out(o) {}
    void on_batch_end(Trainer&, const BatchLogs& b) override { out->push_back(b.loss); }
  };
  s.trainer->add_callback(std::make_shared<Losses>(&batch_losses));
  const FitResult r = s.trainer->fit(train, nullptr, o);
  ASSERT_EQ(batch_losses.size(), 2u);
  const double by_rows = (256.0 * batch_losses[0] + 44.0 * batch_losses[1]) / 300.0;
  EXPECT_NEAR(r.history[0].train_loss, by_rows, 1e-6);
  EXPECT_GT(std::abs(r.history[0].train_loss - (batch_losses[0] + batch_losses[1]) / 2), 1e-4)
      << "the batches' losses differ enough to tell the two means apart";
}

// An epoch's seconds are its wall time, what `hpm plot --x seconds` adds up: callbacks' work in
// it (codistillation's exchanges) counts. They were the steps' time alone; samples_per_s stays the
// steps' rate, as the PyTorch peers time theirs.
TEST(Trainer, AnEpochsSecondsAreItsWallTime) {
  auto train = blobs(64, 3);  // 4 steps
  Rig s = make();
  struct Slow : Callback {
    void on_batch_end(Trainer&, const BatchLogs&) override {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  };
  s.trainer->add_callback(std::make_shared<Slow>());
  FitOptions o;
  o.batch_size = 16;
  const FitResult r = s.trainer->fit(train, nullptr, o);
  ASSERT_EQ(r.history.size(), 1u);
  EXPECT_GE(r.history[0].seconds, 4 * 0.025);
  EXPECT_GT(r.history[0].samples_per_s, 64 / r.history[0].seconds);
}

// stop_training() at an epoch's last step ends that epoch as done: evaluated, called back and
// saved as the next epoch's start. It was saved as a position past the epoch's end (epoch 0, step
// 4 of 4) and the epoch was never evaluated; resumed, it logged an epoch of no batches.
TEST(Trainer, AStopAtAnEpochsLastStepEndsThatEpoch) {
  auto train = blobs(256, 3), test = blobs(64, 4);
  TempDir dir;
  Rig s = make();
  s.trainer->add_callback(std::make_shared<StopAt>(4));  // 4 steps an epoch
  FitOptions o;
  o.batch_size = 64;
  o.epochs = 3;
  o.checkpoint_dir = dir.path();
  const FitResult r = s.trainer->fit(train, &test, o);
  ASSERT_EQ(r.history.size(), 1u);
  EXPECT_GE(r.history[0].test_accuracy, 0.0);
  const TrainerState saved = read_checkpoint_state(dir.path());
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.step_in_epoch, 0);
}

// A continued run keeps the metrics log of the epochs it had finished and writes on after them
// (it was started anew, losing them); a fresh run starts it anew.
TEST(Trainer, TheMetricsLogOfAContinuedRunKeepsItsFinishedEpochs) {
  auto train = blobs(64, 3);  // 4 steps an epoch
  TempDir dir;
  const std::string csv = dir / "metrics.csv";
  const auto rows = [&] {
    std::ifstream in(csv);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line.substr(0, line.find(',')));
    return out;
  };
  FitOptions o;
  o.epochs = 4;
  o.batch_size = 16;
  o.checkpoint_dir = dir / "ck";
  Rig first = make();
  first.trainer->add_callback(std::make_shared<CsvLogger>(csv));
  first.trainer->add_callback(std::make_shared<StopAt>(10));  // mid-epoch 3
  first.trainer->fit(train, nullptr, o);
  EXPECT_EQ(rows(), (std::vector<std::string>{"epoch", "1", "2"}));

  Rig second = make();
  second.trainer->add_callback(std::make_shared<CsvLogger>(csv));
  FitOptions resumed = o;
  resumed.resume_from = dir / "ck";
  second.trainer->fit(train, nullptr, resumed);
  EXPECT_EQ(rows(), (std::vector<std::string>{"epoch", "1", "2", "3", "4"}));

  Rig fresh = make();
  fresh.trainer->add_callback(std::make_shared<CsvLogger>(csv));
  FitOptions again = o;
  again.epochs = 1;
  again.checkpoint_dir.clear();
  fresh.trainer->fit(train, nullptr, again);
  EXPECT_EQ(rows(), (std::vector<std::string>{"epoch", "1"}));
}

TEST(Trainer, NonFiniteLossStopsAndNamesTheStep) {
  auto train = blobs(100, 4);
  Rig s = make();
  int calls = 0;
  s.trainer->set_loss([&](const Tensor& logits, const Tensor& y) {
    Tensor l = cross_entropy(logits, y);
    return ++calls == 3 ? mul(l, std::nanf("")) : l;
  });
  FitOptions o;
  o.batch_size = 10;
  try {
    s.trainer->fit(train, nullptr, o);
    FAIL() << "expected TrainingError";
  } catch (const TrainingError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("NaN"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 3"), std::string::npos) << msg;
  }
  EXPECT_EQ(s.trainer->state().global_step, 2);
}

// A NaN in the input reaches the loss through ReLU (which mapped it to 0: the run went on with NaN
// weights behind finite losses) and stops the run before the update.
TEST(Trainer, ANaNInputStopsTheRunThroughAReLU) {
  auto train = blobs(100, 4);
  train.inputs.data<float>()[3] = std::nanf("");
  Rig s = make();
  const auto before = flat_params(*s.model);
  FitOptions o;
  o.batch_size = 10;
  o.shuffle = false;
  try {
    s.trainer->fit(train, nullptr, o);
    FAIL() << "trained on";
  } catch (const TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("loss is NaN at epoch 1, step 1"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(flat_params(*s.model), before);
}

// The parameters after each step, as on_batch_end sees them.
class SnapshotEachStep : public Callback {
 public:
  void on_batch_end(Trainer& t, const BatchLogs&) override {
    after.push_back(flat_params(t.model()));
  }
  std::vector<std::vector<float>> after;
};

// AdamW gates its update on the device, so the Trainer issues a step's update before it reads the
// step's loss (the read, begun after the forward, then waits for the forward alone). A NaN loss,
// or a bad label, at step 3 still stops the run there with the model, the moments and the step
// count as step 2 left them, and the optimizer not left halted: the gate skipped the update and
// the Trainer took its count back.
// Without clipping, no norm would skip the NaN gradients: the gate alone stops them.
TEST(Trainer, AStepWhoseUpdateIsIssuedBeforeItsLossIsReadStopsWithNothingChanged) {
  for (const int variant : {0, 1, 2}) {
    const bool bad_label = variant == 2, clip = variant == 1;
    SCOPED_TRACE(bad_label ? "a label out of range" : clip ? "a NaN loss, clipping" : "a NaN loss");
    auto train = blobs(100, 4);
    Rig s = make();
    optim::AdamOptions ao;
    ao.lr = 1e-2f;
    auto opt = std::make_shared<optim::AdamW>(s.model->named_parameters(), ao);
    ASSERT_TRUE(opt->gates_on_device());
    s.trainer = std::make_unique<Trainer>(s.model, opt);
    int calls = 0;
    std::vector<float> params_after_2, state_after_2;
    s.trainer->set_loss([&](const Tensor& logits, const Tensor& y) {
      if (++calls == 3) {
        params_after_2 = flat_params(*s.model);
        state_after_2 = hpm::testing::flat_optimizer_state(*opt);
        if (!bad_label) return mul(cross_entropy(logits, y), std::nanf(""));
        Tensor labels = y.clone();
        labels.data<std::int64_t>()[1] = 7;  // 3 classes
        return cross_entropy(logits, labels);
      }
      return cross_entropy(logits, y);
    });
    FitOptions o;
    o.batch_size = 10;
    o.clip_grad_norm = clip ? 1.0f : 0.0f;
    try {
      s.trainer->fit(train, nullptr, o);
      FAIL() << "trained on";
    } catch (const TrainingError& e) {
      EXPECT_FALSE(bad_label);
      EXPECT_NE(std::string(e.what()).find("loss is NaN at epoch 1, step 3"), std::string::npos)
          << e.what();
    } catch (const std::out_of_range& e) {
      EXPECT_TRUE(bad_label) << e.what();
    }
    EXPECT_EQ(calls, 3);
    EXPECT_EQ(flat_params(*s.model), params_after_2);
    EXPECT_EQ(hpm::testing::flat_optimizer_state(*opt), state_after_2);
    EXPECT_EQ(opt->steps(), 2);
    EXPECT_FALSE(opt->updates_halted());
  }
}

// A finite loss whose gradients are NaN at one step (sqrt's backward at 0, a classic of distance
// losses): with clipping, the norm says so and the update is skipped on the device (Adam's fused
// step) or the host (SGD's); the run stops naming that step (at its backup, or after the next
// step's forward and backward without one), no backup holds what it did, and the model is as it
// was before it. Without the gate the NaN gradients were applied: the model was NaN, and so was
// the backup written at that step.
TEST(Trainer, NonFiniteGradientsUnderAFiniteLossStopWithoutUpdating) {
  for (const int variant : {0, 1, 2, 3}) {
    const bool adam = variant < 2, backups = variant % 2 == 0;
    SCOPED_TRACE(std::string(adam ? "AdamW (fused, gated on the device)" : "SGD (on the host)") +
                 (backups ? ", a backup every step" : ""));
    auto train = blobs(100, 4);
    Rig s = make();
    std::shared_ptr<optim::Optimizer> opt = s.opt;
    if (adam) {
      optim::AdamOptions ao;
      ao.lr = 1e-2f;
      opt = std::make_shared<optim::AdamW>(s.model->named_parameters(), ao);
      s.trainer = std::make_unique<Trainer>(s.model, opt);
    }
    int calls = 0;
    s.trainer->set_loss([&](const Tensor& logits, const Tensor& y) {
      Tensor l = cross_entropy(logits, y);
      if (++calls != 3) return l;
      // sqrt(0) = 0 adds nothing to the loss; its gradient, inf times 0, is NaN everywhere.
      return add(l, sqrt(sum(mul(logits, 0.0f))));
    });
    auto snapshots = std::make_shared<SnapshotEachStep>();
    s.trainer->add_callback(snapshots);
    TempDir dir;
    FitOptions o;
    o.batch_size = 10;
    o.clip_grad_norm = 1.0f;
    if (backups) {
      o.backup_dir = dir.path();
      o.backup_every_steps = 1;
    }
    try {
      s.trainer->fit(train, nullptr, o);
      FAIL() << "expected TrainingError";
    } catch (const TrainingError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("gradients are not finite"), std::string::npos) << msg;
      EXPECT_NE(msg.find("global step 3"), std::string::npos) << msg;
    }
    EXPECT_TRUE(opt->updates_halted());
    ASSERT_GE(snapshots->after.size(), 2u);
    const std::vector<float> now = flat_params(*s.model);
    EXPECT_EQ(now, snapshots->after[1]) << "the model is not as step 2 left it";
    for (const float x : now) ASSERT_TRUE(std::isfinite(x));
    EXPECT_EQ(calls, backups ? 3 : 4);  // without a backup, the next step's verdict stops it
    if (!backups) continue;
    // The newest backup is step 2's, and holds what step 2 left.
    Rig restored = make(99);
    const TrainerState st = load_checkpoint(dir.path(), *restored.model, nullptr);
    EXPECT_EQ(st.global_step, 2);
    EXPECT_EQ(flat_params(*restored.model), snapshots->after[1]);
  }
}

// Accumulated micro-batches under AdamW's gated update: each micro-batch's loss and metrics read
// by its own read, begun after its forward, each loss gating the update; the step's loss and
// accuracy and the trained parameters are those of one batch of the same rows (the dropout masks
// too: drawn row after row from one generator, whatever the split).
TEST(Trainer, AccumulatedMicroBatchesUnderAGatedUpdateTrainAsOneBatch) {
  auto train = blobs(120, 4);
  const auto fit_with = [&](int micro_batches) {
    Rig s = make();
    optim::AdamOptions ao;
    ao.lr = 1e-2f;
    s.trainer = std::make_unique<Trainer>(
        s.model, std::make_shared<optim::AdamW>(s.model->named_parameters(), ao));
    FitOptions o;
    o.batch_size = 30;
    o.shuffle = false;
    o.epochs = 2;
    o.accumulation_steps = micro_batches;
    const FitResult r = s.trainer->fit(train, nullptr, o);
    return std::make_pair(r, flat_params(*s.model));
  };
  const auto [one, one_params] = fit_with(1);
  const auto [three, three_params] = fit_with(3);
  ASSERT_EQ(three.history.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_NEAR(three.history[e].train_loss, one.history[e].train_loss, 1e-5) << e;
    EXPECT_NEAR(three.history[e].train_accuracy, one.history[e].train_accuracy, 1e-9) << e;
  }
  ASSERT_EQ(three_params.size(), one_params.size());
  for (std::size_t i = 0; i < one_params.size(); ++i)
    ASSERT_NEAR(three_params[i], one_params[i], 1e-5) << i;
}

// (inputs, labels) batches of `rows` from a generator: a dataset of unknown length.
data::Dataset unknown_length(const data::LabelledData& d, std::int64_t rows) {
  return data::Dataset::from_generator([d, rows](std::int64_t i, data::Element& out) {
    if ((i + 1) * rows > d.size()) return false;
    out = {d.inputs.narrow(i * rows, rows), d.labels.narrow(i * rows, rows)};
    return true;
  });
}

TEST(Trainer, AnEpochWithoutABatchIsAnInputError) {
  Rig s = make();
  try {
    s.trainer->fit(unknown_length(blobs(8, 4), 10), nullptr, FitOptions{});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the training data yields no batch in epoch 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.trainer->state().global_step, 0);
}

TEST(Trainer, ProgressOfUnknownLengthShowsNoTotal) {
  Rig s = make();
  std::FILE* progress = std::tmpfile();
  s.trainer->add_callback(std::make_shared<ProgressCallback>(progress, false, 1, 2));
  s.trainer->fit(unknown_length(blobs(40, 4), 10), nullptr, FitOptions{});
  std::rewind(progress);
  std::string shown(4096, '\0');
  shown.resize(std::fread(shown.data(), 1, shown.size(), progress));
  std::fclose(progress);
  EXPECT_NE(shown.find("epoch 1 step 2 loss"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("/-2"), std::string::npos) << shown;
}

TEST(Trainer, ResumingMidEpochWithAnotherBatchSizeIsRefused) {
  TempDir dir;
  auto train = blobs(200, 3);
  Rig a = make();
  a.trainer->add_callback(std::make_shared<StopAt>(7));
  FitOptions o;
  o.batch_size = 20;
  o.checkpoint_dir = dir / "ckpt";
  a.trainer->fit(train, nullptr, o);  // stopped at step 7 of 10: saved mid-epoch
  Rig b = make();
  FitOptions other = o;
  other.batch_size = 40;
  other.resume_from = dir / "ckpt";
  try {
    b.trainer->fit(train, nullptr, other);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("was saved at step 7 of epoch 1 with batch size 20, but "
                                         "this run's batch size is 40"),
              std::string::npos)
        << e.what();
  }
  // The epoch's order comes from the seed: another one mid-epoch is refused too.
  Rig s = make();
  FitOptions reseeded = o;
  reseeded.seed = 5;
  reseeded.resume_from = dir / "ckpt";
  try {
    s.trainer->fit(train, nullptr, reseeded);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("with seed 0, but this run's seed is 5"),
              std::string::npos)
        << e.what();
  }
  Rig c = make();
  FitOptions same = o;
  same.resume_from = dir / "ckpt";
  EXPECT_EQ(c.trainer->fit(train, nullptr, same).steps, 3);
}

// What else fixes the order of the data (the CLI's [data] shuffle, limits, files) must be the same
// for a mid-epoch position to mean the same batches: restored into another order, some examples
// were trained twice in the epoch and others never. At an epoch's end it may change.
TEST(Trainer, ResumingMidEpochWithAnotherInputOrderIsRefused) {
  TempDir dir;
  auto train = blobs(200, 3);
  Rig a = make();
  a.trainer->add_callback(std::make_shared<StopAt>(7));
  FitOptions o;
  o.batch_size = 20;
  o.epochs = 2;
  o.checkpoint_dir = dir / "mid";
  o.input_order = {{"[data] shuffle", "true"}};
  a.trainer->fit(train, nullptr, o);  // stopped at step 7 of 10: saved mid-epoch
  Rig b = make();
  FitOptions unshuffled = o;
  unshuffled.checkpoint_dir.clear();
  unshuffled.resume_from = dir / "mid";
  unshuffled.input_order = {{"[data] shuffle", "false"}};
  try {
    b.trainer->fit(train, nullptr, unshuffled);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("was saved at step 7 of epoch 1 with [data] shuffle "
                                         "true, but this run has [data] shuffle false"),
              std::string::npos)
        << e.what();
  }
  Rig whole = make();
  FitOptions one_epoch = o;
  one_epoch.epochs = 1;
  one_epoch.checkpoint_dir = dir / "end";
  whole.trainer->fit(train, nullptr, one_epoch);
  Rig next = make();
  FitOptions at_the_end = unshuffled;
  at_the_end.resume_from = dir / "end";
  EXPECT_EQ(next.trainer->fit(train, nullptr, at_the_end).steps, 10);
}

// Batches of 8 rows by global step, `every` to an epoch (a stretch between evaluations): batch g
// is the same whatever the stretches, as random_windows' draws are.
data::Dataset stretches(const data::LabelledData& d, std::int64_t every) {
  return data::Dataset::from_epoch_generator(
      [d, every](std::int64_t epoch, std::int64_t k, data::Element& out) {
        if (k >= every) return false;
        const std::int64_t g = (epoch * every + k) % (d.size() / 8);
        out = {d.inputs.narrow(g * 8, 8), d.labels.narrow(g * 8, 8)};
        return true;
      },
      every);
}

// Training by steps, continued with stretches of another length (another eval_every): it ends at
// the same step as a run never interrupted, with the same weights, whether the saved step falls
// on a boundary of the new stretches or inside one. Counted in saved epochs instead, it would
// train nothing (the epochs already reached) or past the last step.
// Batches of 8 by step (by_steps), and the model after 20 steps in 4 stretches of 5: what a run by
// steps with another stretch length, or continued, must end at.
FitOptions by_steps_of_8() {
  FitOptions o;
  o.batch_size = 8;
  o.by_steps = true;
  return o;
}

Rig twenty_steps(const data::LabelledData& train) {
  Rig straight = make();
  FitOptions all = by_steps_of_8();
  all.epochs = 4;
  straight.trainer->fit(stretches(train, 5), nullptr, all);
  return straight;
}

TEST(Trainer, ByStepsContinuedInStretchesOfAnotherLengthEndsAtTheSameStep) {
  const auto train = blobs(160, 3);  // 20 batches of 8
  const FitOptions o = by_steps_of_8();
  Rig straight = twenty_steps(train);
  ASSERT_EQ(straight.trainer->state().global_step, 20);
  struct Case {
    std::int64_t every, epochs, stop_at, then_every;
  };
  for (const Case& c : {Case{5, 2, 0, 10},     // step 10 ends stretch 2 of 5 and 1 of 10
                        Case{10, 1, 0, 5},     // step 10 ends stretch 1 of 10 and 2 of 5
                        Case{5, 4, 7, 4},      // step 7: in stretch 2 of 5, and of 4
                        Case{5, 4, 7, 20}}) {  // step 7: in stretch 2 of 5, the first of 20
    const std::string what =
        "stretches of " + std::to_string(c.every) + ", then of " + std::to_string(c.then_every);
    TempDir dir;
    Rig first = make();
    if (c.stop_at > 0) first.trainer->add_callback(std::make_shared<StopAt>(c.stop_at));
    FitOptions o1 = o;
    o1.epochs = c.epochs;
    o1.checkpoint_dir = dir / "ckpt";
    const std::int64_t saved = first.trainer->fit(stretches(train, c.every), nullptr, o1).steps;
    Rig second = make(99);  // different init: everything must come from the checkpoint
    FitOptions o2 = o;
    o2.epochs = 20 / c.then_every;
    o2.resume_from = dir / "ckpt";
    const FitResult r = second.trainer->fit(stretches(train, c.then_every), nullptr, o2);
    EXPECT_EQ(r.steps, 20 - saved) << what;
    EXPECT_EQ(second.trainer->state().global_step, 20) << what;
    EXPECT_EQ(flat_params(*second.model), flat_params(*straight.model)) << what;
  }
}

// A step budget the stretch length does not divide: evaluated at each stretch's end and at the
// last step, the last stretch cut short, and the weights those of the same steps in stretches
// that do divide it.
TEST(Trainer, ByStepsWithABudgetTheStretchesDoNotDivide) {
  const auto train = blobs(160, 3);  // 20 batches of 8
  const auto test = blobs(40, 4);
  Rig straight = twenty_steps(train);
  Rig budget = make();
  FitOptions cut = by_steps_of_8();
  cut.epochs = 1;  // ignored with max_steps
  cut.max_steps = 20;
  const FitResult r = budget.trainer->fit(stretches(train, 7), &test, cut);
  EXPECT_EQ(r.steps, 20);
  ASSERT_EQ(r.history.size(), 3u);
  EXPECT_EQ(r.history[0].global_step, 7);
  EXPECT_EQ(r.history[1].global_step, 14);
  EXPECT_EQ(r.history[2].global_step, 20);
  for (const auto& e : r.history)
    EXPECT_GE(e.test_loss, 0) << "evaluated at step " << e.global_step;
  EXPECT_EQ(flat_params(*budget.model), flat_params(*straight.model));
  // The first step apart (what benchmarks leave out as warm-up): its rows and time, and the rate
  // of the 19 after it.
  EXPECT_EQ(r.first_step_samples, 8);
  EXPECT_GT(r.first_step_seconds, 0);
  EXPECT_NEAR(r.samples_per_s_after_first(), 152.0 / (r.train_seconds - r.first_step_seconds),
              1e-6);
}

TEST(Trainer, UnwritableCheckpointDirectoryFailsBeforeTraining) {
  TempDir dir;
  std::ofstream(dir / "file") << "x";
  auto train = blobs(50, 5);
  Rig s = make();
  const auto before = flat_params(*s.model);
  FitOptions o;
  o.batch_size = 10;
  o.checkpoint_dir = dir / "file/ckpt";  // a path below a regular file
  try {
    s.trainer->fit(train, nullptr, o);
    FAIL() << "expected IoError";
  } catch (const io::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("file/ckpt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(flat_params(*s.model), before);
}

TEST(Trainer, CorruptCheckpointIsDetected) {
  TempDir dir;
  auto train = blobs(64, 6);
  Rig s = make();
  FitOptions o;
  o.batch_size = 16;
  o.checkpoint_dir = dir.path();
  const std::string ckpt = s.trainer->fit(train, nullptr, o).last_checkpoint;
  const std::string model_file = ckpt + "/model.safetensors";
  {
    std::fstream f(model_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  Rig other = make(5);
  const auto before = flat_params(*other.model);
  try {
    load_checkpoint(dir.path(), *other.model, other.opt.get());
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_EQ(flat_params(*other.model), before);
}

TEST(Trainer, CheckpointKeepsOnlyTheNewest) {
  TempDir dir;
  auto train = blobs(64, 7);
  Rig s = make();
  FitOptions o;
  o.batch_size = 16;
  o.epochs = 4;
  o.checkpoint_dir = dir.path();
  s.trainer->fit(train, nullptr, o);
  int count = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) count += e.is_directory();
  EXPECT_EQ(count, 2);
  EXPECT_TRUE(std::filesystem::exists(dir / "ckpt-16/trainer_state.json"));
}

TEST(Trainer, StepPeakMemoryIsBounded) {
  // mlp of the issue: 784-512-256-10 at batch 64. Parameters are 535,818 floats (2.1 MB); a step
  // allocates gradients and momentum (2 x params) plus activations and their gradients (~0.6 MB)
  // and the GEMM/temporary buffers. It must not exceed 4x the parameter bytes.
  manual_seed(0);
  auto model = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(784, 512), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(512, 256), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(256, 10)});
  auto opt =
      std::make_shared<optim::SGD>(model->named_parameters(), optim::SgdOptions{0.05f, 0.9f});
  Trainer t(model, opt);
  Generator gen(1);
  data::LabelledData d{Tensor::uniform({256, 784}, gen, 0.0f, 1.0f),
                       Tensor::zeros({256}, DType::I64)};
  FitOptions o;
  o.batch_size = 64;
  FitResult r = t.fit(d, nullptr, o);
  const std::size_t param_bytes = static_cast<std::size_t>(model->num_parameters()) * 4;
  EXPECT_GT(r.step_peak_bytes, param_bytes) << "gradients alone are as large as the parameters";
  EXPECT_LT(r.step_peak_bytes, 4 * param_bytes);
}

TEST(Trainer, EvaluateAndPredictAgree) {
  auto data = blobs(120, 8);
  Rig s = make();
  Tensor logits = s.trainer->predict(data.inputs, 50);
  ASSERT_EQ(logits.shape(), (Shape{120, 3}));
  const EvalResult ev = s.trainer->evaluate(data, 50);
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < 120; ++i) {
    const float* row = logits.data<float>() + i * 3;
    const std::int64_t pred = std::max_element(row, row + 3) - row;
    correct += pred == data.labels.data<std::int64_t>()[i];
  }
  EXPECT_DOUBLE_EQ(ev.accuracy, correct / 120.0);
}

// Fits the same 8-16-3 mlp on `data` twice, plainly and through Mirrored with 2 replicas (the
// same batches; gradients averaged over replicas, so equal up to reassociation), `setup` given
// each Trainer first; expects the same parameters. Returns the Mirrored trainer's last result.
FitResult fit_plain_and_mirrored(const data::LabelledData& data, const FitOptions& o,
                                 const std::function<void(Trainer&)>& setup) {
  auto build = [] {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(16, 3)});
  };
  auto sgd = [](nn::Module& m) {
    return std::make_shared<optim::SGD>(m.named_parameters(), optim::SgdOptions{0.05f, 0.9f});
  };
  manual_seed(5);
  auto model = build();
  Trainer plain(model, sgd(*model));
  setup(plain);
  plain.fit(data, nullptr, o);
  distribute::StrategyOptions so;
  so.replicas = 2;
  auto strategy = distribute::make_mirrored(so);
  manual_seed(5);
  strategy->scope(build, sgd);
  Trainer mirrored(strategy);
  setup(mirrored);
  const FitResult r = mirrored.fit(data, nullptr, o);
  EXPECT_TRUE(mirrored.last_step_metrics().has("loss"));
  const auto a = flat_params(*model), b = flat_params(*strategy->model());
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-4f + 1e-4f * std::abs(a[i])) << i;
  return r;
}

// The library path of data-parallel training: a Trainer over a Mirrored strategy fits like the
// plain Trainer.
TEST(Trainer, FitThroughAStrategyMatchesOneDevice) {
  FitOptions o;
  o.batch_size = 32;
  o.epochs = 2;
  EXPECT_EQ(fit_plain_and_mirrored(blobs(256, 3), o, [](Trainer&) {}).steps, 16);
}

// Under Mirrored every replica's gradients are the all-reduced NaN ones: each replica's fused
// Adam skips the update, and the Trainer stops after that step naming it, its model as before it.
TEST(Trainer, NonFiniteGradientsStopAMirroredFitAfterThatStep) {
  auto build = [] {
    return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(16, 3)});
  };
  auto adamw = [](nn::Module& m) {
    optim::AdamOptions ao;
    ao.lr = 1e-2f;
    return std::make_shared<optim::AdamW>(m.named_parameters(), ao);
  };
  distribute::StrategyOptions so;
  so.replicas = 2;
  auto strategy = distribute::make_mirrored(so);
  manual_seed(5);
  strategy->scope(build, adamw);
  Trainer mirrored(strategy);
  std::atomic<int> calls{0};  // two a step, one per replica (each on its own thread)
  mirrored.set_loss([&](const Tensor& logits, const Tensor& y) {
    Tensor l = cross_entropy(logits, y);
    if (calls.fetch_add(1) / 2 != 2) return l;
    return add(l, sqrt(sum(mul(logits, 0.0f))));  // global step 3: NaN gradients
  });
  auto snapshots = std::make_shared<SnapshotEachStep>();
  mirrored.add_callback(snapshots);
  FitOptions o;
  o.batch_size = 32;
  o.clip_grad_norm = 1.0f;
  try {
    mirrored.fit(blobs(256, 3), nullptr, o);
    FAIL() << "expected TrainingError";
  } catch (const TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("global step 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls.load(), 6);
  ASSERT_EQ(snapshots->after.size(), 2u);  // the stop comes before step 3's callbacks
  EXPECT_EQ(flat_params(*strategy->model()), snapshots->after[1]);
}

// Objectives see each replica's own rows (distillation's teachers run on them): a loss that pulls
// the first logit toward the first input feature, a row mean, so replicas add up exactly.
TEST(Trainer, ALossOfTheInputsRunsUnderAStrategyAsOnOneDevice) {
  FitOptions o;
  o.batch_size = 32;
  fit_plain_and_mirrored(blobs(256, 3), o, [](Trainer& t) {
    t.set_input_loss([](const Tensor& x, const Tensor& logits, const Tensor& labels) {
      return add(cross_entropy(logits, labels),
                 mse_loss(narrow(logits, 1, 0, 1), narrow(x, 1, 0, 1)));
    });
  });
}

}  // namespace
}  // namespace hpm::train

namespace hpm::train {
namespace {

// A language model through the Trainer: the objective's metrics (token accuracy, perplexity)
// reach the step logs, the epoch logs, the progress line and the CSV log. The corpus is a
// period-5 token pattern, which a tiny GPT learns within a few epochs.
TEST(Trainer, LanguageModelMetricsReachLogsProgressAndCsv) {
  const std::int64_t rows = 96, block = 8;
  data::LabelledData windows{Tensor::zeros({rows, block}, DType::I64),
                             Tensor::zeros({rows, block}, DType::I64)};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = 0; t < block; ++t) {
      windows.inputs.data<std::int64_t>()[r * block + t] = (r + t) % 5;
      windows.labels.data<std::int64_t>()[r * block + t] = (r + t + 1) % 5;
    }
  manual_seed(3);
  nn::GPTConfig g;
  g.n_layer = 1;
  g.n_head = 2;
  g.n_embd = 16;
  g.block_size = block;
  g.vocab_size = 8;
  auto model = std::make_shared<nn::GPT>(g);
  optim::AdamOptions ao;
  ao.lr = 1e-2f;
  Trainer trainer(model, std::make_shared<optim::AdamW>(model->named_parameters(), ao));
  trainer.set_objective(std::make_shared<nn::LanguageModelling>());
  hpm::testing::TempDir dir;
  trainer.add_callback(std::make_shared<CsvLogger>(dir / "metrics.csv"));
  std::FILE* progress = std::tmpfile();
  trainer.add_callback(std::make_shared<ProgressCallback>(progress, false, 4, 3));
  FitOptions o;
  o.batch_size = 16;
  o.epochs = 4;
  const FitResult r = trainer.fit(windows, nullptr, o);
  ASSERT_EQ(r.history.size(), 4u);
  const nn::Metrics& last = r.history.back().train_metrics;
  EXPECT_LT(last.mean("loss"), 0.5 * std::log(8.0)) << "the pattern is learnable";
  EXPECT_GT(last.mean("token_accuracy"), 0.8);
  EXPECT_NEAR(last.mean("perplexity"), std::exp(last.mean("loss")), 1e-9);
  EXPECT_EQ(last.count("loss"), 96.0 * 8.0) << "every token of the epoch, once";
  // What monitors and logs read of it: a language model's accuracy is its token accuracy (the
  // epoch's train_accuracy was 0 here, every stretch).
  EXPECT_EQ(r.history.back().train_accuracy, last.mean("token_accuracy"));
  EXPECT_EQ(r.history.back().train_loss, last.mean("loss"));
  std::rewind(progress);
  std::string shown(4096, '\0');
  shown.resize(std::fread(shown.data(), 1, shown.size(), progress));
  std::fclose(progress);
  EXPECT_NE(shown.find("token_acc"), std::string::npos) << shown;
  EXPECT_NE(shown.find(" ppl "), std::string::npos) << shown;
  std::ifstream csv(dir / "metrics.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header,
            "epoch,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples_per_s,seconds,"
            "train_token_accuracy,train_perplexity");
  // A language model has no per-row accuracy: its cell is empty, not a 0 (its token accuracy is
  // in its own column).
  std::string row;
  std::getline(csv, row);
  EXPECT_EQ(row.rfind("1,", 0), 0u) << row;
  EXPECT_EQ(row.substr(row.find(',', 2), 3), ",,,") << "train_accuracy, test_loss empty: " << row;
}

// Preempted right after an epoch's last step, the run ends that epoch as an uninterrupted one
// would (evaluation, callbacks, a backup at the boundary): continued, it starts the next epoch
// instead of logging an epoch of no batches (loss 0, accuracy 0, 0 samples/s), and ends where an
// uninterrupted run ends.
TEST(OutputDirectories, PreemptedAfterAnEpochsLastStepContinuesWithTheNextEpoch) {
  TempDir dir;
  auto train = blobs(64, 6), test = blobs(32, 7);
  FitOptions o;
  o.batch_size = 16;  // 4 steps an epoch
  o.epochs = 3;
  Rig straight = make();
  const FitResult whole = straight.trainer->fit(train, &test, o);

  std::atomic<bool> stop{false};
  class StopAfter : public Callback {
   public:
    StopAfter(std::atomic<bool>& stop, std::int64_t step) : stop_(stop), step_(step) {}
    // The signal arrives during the step that ends epoch 1: fit sees it after that step.
    void on_batch_end(Trainer&, const BatchLogs& b) override {
      if (b.global_step == step_ - 1) stop_ = true;
    }

   private:
    std::atomic<bool>& stop_;
    std::int64_t step_;
  };
  o.backup_dir = dir / "backup";
  o.stop_signal = &stop;
  Rig first = make();
  first.trainer->add_callback(std::make_shared<StopAfter>(stop, 4));
  const FitResult cut = first.trainer->fit(train, &test, o);
  ASSERT_TRUE(cut.preempted);
  EXPECT_EQ(cut.steps, 4);
  ASSERT_EQ(cut.history.size(), 1u) << "epoch 1 ended, evaluated";
  EXPECT_EQ(cut.history[0].test_loss, whole.history[0].test_loss);

  stop = false;
  o.stop_signal = nullptr;
  Rig second = make();
  const FitResult rest = second.trainer->fit(train, &test, o);
  EXPECT_EQ(rest.steps, 8);
  ASSERT_EQ(rest.history.size(), 2u) << "epochs 2 and 3 only";
  for (const EpochLogs& e : rest.history) EXPECT_GT(e.samples_per_s, 0.0);
  EXPECT_EQ(rest.history.back().test_loss, whole.history.back().test_loss);
}

// FitOptions::metadata is saved with each checkpoint; a run continued from one that recorded
// another value under the same key is refused before it trains.
TEST(Trainer, CheckpointsRecordTheRunsMetadataAndAContinuationMustAgree) {
  TempDir dir;
  auto train = blobs(64, 8);
  FitOptions o;
  o.batch_size = 16;
  o.checkpoint_dir = dir.path();
  o.metadata = {{"tokenizer", "sentencepiece:0000abcd"}};
  Rig first = make();
  first.trainer->fit(train, nullptr, o);
  Rig reader = make();
  EXPECT_EQ(load_checkpoint(dir.path(), *reader.model, nullptr).metadata, o.metadata);

  Rig other = make();
  FitOptions again = o;
  again.resume_from = dir.path();
  again.epochs = 2;
  again.metadata["tokenizer"] = "bytes";
  try {
    other.trainer->fit(train, nullptr, again);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with tokenizer sentencepiece:0000abcd, this "
                                         "run has tokenizer bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(flat_params(*other.model), flat_params(*first.model)) << "loaded, not trained";
}

}  // namespace
}  // namespace hpm::train
