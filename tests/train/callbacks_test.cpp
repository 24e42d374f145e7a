// EarlyStopping and BestModelCheckpoint: the decisions on crafted epoch metrics (patience,
// min_delta, mode), then inside real fits (stopping, restoring the best weights, keeping only the
// best epoch's checkpoint).
#include "hpm/train/callbacks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "common/blobs.h"
#include "common/temp_dir.h"
#include "hpm/io/atomic_file.h"
#include "hpm/nn/layers.h"
#include "hpm/tensor/random.h"

namespace hpm::train {
namespace {

using hpm::testing::blobs;
using hpm::testing::TempDir;

std::shared_ptr<nn::Sequential> make_model(std::uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 3)});
}

struct Rig {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<optim::SGD> opt;
  std::unique_ptr<Trainer> trainer;
};

Rig make(std::uint64_t seed = 1) {
  Rig s;
  s.model = make_model(seed);
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

EpochLogs logs(std::int64_t epoch, double test_loss, double test_accuracy = 0.5) {
  EpochLogs e;
  e.epoch = epoch;
  e.train_loss = test_loss;
  e.train_accuracy = test_accuracy;
  e.test_loss = test_loss;
  e.test_accuracy = test_accuracy;
  return e;
}

// Feeds EarlyStopping one epoch's metric at a time, as fit would; returns the epochs it saw
// before it asked to stop (all of them if it never did).
std::int64_t drive(EarlyStopping& es, Trainer& trainer, const std::vector<double>& values,
                   bool accuracy = false) {
  es.on_train_begin(trainer);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto epoch = static_cast<std::int64_t>(i);
    es.on_epoch_end(trainer, accuracy ? logs(epoch, 1.0, values[i]) : logs(epoch, values[i]));
    if (es.stopped_epoch() >= 0) return epoch + 1;
  }
  return static_cast<std::int64_t>(values.size());
}

// Trains normally until epoch `from`, then on wrong labels (each shifted to the next class): the
// weights keep changing but the test loss gets worse, so the best epoch is not the last one.
class MislabelFrom : public Callback {
 public:
  explicit MislabelFrom(std::int64_t from) : from_(from) {}
  void on_epoch_begin(Trainer&, std::int64_t epoch) override { wrong = epoch >= from_; }
  bool wrong = false;

 private:
  std::int64_t from_;
};

void mislabel_after(Trainer& trainer, std::int64_t from) {
  auto m = std::make_shared<MislabelFrom>(from);
  trainer.add_callback(m);
  trainer.set_loss([m](const Tensor& logits, const Tensor& y) {
    if (!m->wrong) return cross_entropy(logits, y);
    Tensor shifted = y.clone();
    for (std::int64_t i = 0; i < shifted.numel(); ++i) {
      auto& label = shifted.data<std::int64_t>()[i];
      label = (label + 1) % 3;
    }
    return cross_entropy(logits, shifted);
  });
}

// The parameters at the end of every epoch.
class RecordParams : public Callback {
 public:
  void on_epoch_end(Trainer& t, const EpochLogs& e) override {
    at_epoch[e.epoch] = flat_params(t.model());
  }
  std::map<std::int64_t, std::vector<float>> at_epoch;
};

// ---- EarlyStopping on crafted metrics -------------------------------------------------------

TEST(EarlyStopping, StopsAfterPatienceEpochsWithoutImprovement) {
  Rig s = make();
  EarlyStoppingOptions o;
  o.patience = 2;
  EarlyStopping es(o);
  EXPECT_EQ(es.mode(), "min");  // auto, for a loss
  // Epoch 1 is the best; 2 and 3 do not improve on it; the second of them stops.
  EXPECT_EQ(drive(es, *s.trainer, {1.0, 0.8, 0.9, 0.85, 0.7}), 4);
  EXPECT_EQ(es.stopped_epoch(), 3);
  EXPECT_EQ(es.best_epoch(), 1);
  EXPECT_DOUBLE_EQ(es.best(), 0.8);

  // An improvement resets the count.
  EXPECT_EQ(drive(es, *s.trainer, {1.0, 1.1, 0.9, 1.0, 0.8, 0.85}), 6);
  EXPECT_EQ(es.stopped_epoch(), -1);
  EXPECT_EQ(es.best_epoch(), 4);

  // patience 0, Keras' default: the first epoch without improvement stops.
  EarlyStopping impatient(EarlyStoppingOptions{});
  EXPECT_EQ(drive(impatient, *s.trainer, {1.0, 0.9, 0.9, 0.5}), 3);
  EXPECT_EQ(impatient.stopped_epoch(), 2);  // a tie is not an improvement
}

TEST(EarlyStopping, MinDeltaIsRespected) {
  Rig s = make();
  EarlyStoppingOptions o;
  o.patience = 2;
  const std::vector<double> slow = {1.0, 0.95, 0.91, 0.88, 0.85};  // each step < 0.1 better
  EarlyStopping plain(o);
  EXPECT_EQ(drive(plain, *s.trainer, slow), 5);
  EXPECT_EQ(plain.stopped_epoch(), -1);

  o.min_delta = 0.1;
  EarlyStopping strict(o);
  EXPECT_EQ(drive(strict, *s.trainer, slow), 3);
  EXPECT_EQ(strict.best_epoch(), 0);
  EXPECT_DOUBLE_EQ(strict.best(), 1.0);
  // A change of more than min_delta counts, and the best moves to it.
  EXPECT_EQ(drive(strict, *s.trainer, {1.0, 0.95, 0.85, 0.8, 0.76, 0.7}), 5);
  EXPECT_EQ(strict.best_epoch(), 2);
}

TEST(EarlyStopping, ModeMaxAndMin) {
  Rig s = make();
  EarlyStoppingOptions o;
  o.monitor = "test_accuracy";
  o.patience = 2;
  EarlyStopping acc(o);
  EXPECT_EQ(acc.mode(), "max");  // auto, for an accuracy
  EXPECT_EQ(drive(acc, *s.trainer, {0.5, 0.6, 0.55, 0.58, 0.9}, true), 4);
  EXPECT_DOUBLE_EQ(acc.best(), 0.6);
  EXPECT_EQ(acc.best_epoch(), 1);

  o.mode = "min";  // explicit: a falling accuracy is what this one wants
  EarlyStopping falling(o);
  EXPECT_EQ(drive(falling, *s.trainer, {0.5, 0.6, 0.55, 0.58, 0.9}, true), 3);
  EXPECT_DOUBLE_EQ(falling.best(), 0.5);

  EarlyStoppingOptions loss_max;
  loss_max.monitor = "train_loss";
  loss_max.mode = "max";
  loss_max.patience = 1;
  EarlyStopping rising(loss_max);
  EXPECT_EQ(drive(rising, *s.trainer, {1.0, 1.2, 1.1, 1.5}), 3);
  EXPECT_DOUBLE_EQ(rising.best(), 1.2);
}

TEST(EarlyStopping, BadOptionsAreRejected) {
  auto with = [](auto change) {
    EarlyStoppingOptions o;
    change(o);
    return o;
  };
  try {
    EarlyStopping es(with([](auto& o) { o.monitor = "val_loss"; }));
    FAIL() << "an unknown monitor was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'val_loss'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test_accuracy"), std::string::npos) << e.what();
  }
  EXPECT_THROW(EarlyStopping(with([](auto& o) { o.mode = "down"; })), std::invalid_argument);
  EXPECT_THROW(EarlyStopping(with([](auto& o) { o.patience = -1; })), std::invalid_argument);
  EXPECT_THROW(EarlyStopping(with([](auto& o) { o.min_delta = -0.1; })), std::invalid_argument);
  EXPECT_THROW(BestModelCheckpoint("/tmp/x", "loss"), std::invalid_argument);
}

TEST(EarlyStopping, RestoresTheBestEpochsWeightsWhenTrainingEnds) {
  Rig s = make();
  EarlyStoppingOptions o;
  o.patience = 1;
  o.restore_best_weights = true;
  EarlyStopping es(o);
  es.on_train_begin(*s.trainer);
  const std::vector<float> best = flat_params(*s.model);
  es.on_epoch_end(*s.trainer, logs(0, 0.5));
  for (auto& p : s.model->parameters()) p.fill_(3.0f);
  es.on_epoch_end(*s.trainer, logs(1, 0.7));
  EXPECT_EQ(es.stopped_epoch(), 1);
  // Not at the stop (so the trainer's checkpoint of that epoch holds what was trained) ...
  EXPECT_EQ(flat_params(*s.model), std::vector<float>(best.size(), 3.0f));
  // ... but when fit ends.
  es.on_train_end(*s.trainer, FitResult{});
  EXPECT_EQ(flat_params(*s.model), best);

  // Without the option the last weights stay.
  EarlyStopping keeps(EarlyStoppingOptions{});
  keeps.on_train_begin(*s.trainer);
  keeps.on_epoch_end(*s.trainer, logs(0, 0.5));
  for (auto& p : s.model->parameters()) p.fill_(3.0f);
  keeps.on_epoch_end(*s.trainer, logs(1, 0.7));
  keeps.on_train_end(*s.trainer, FitResult{});
  EXPECT_EQ(flat_params(*s.model), std::vector<float>(best.size(), 3.0f));
}

// ---- Inside fit -----------------------------------------------------------------------------

TEST(EarlyStopping, EndsFitWhenTheLossStopsImproving) {
  auto train = blobs(320, 1), test = blobs(200, 2);
  Rig s = make();
  // From epoch 2 the learning rate is 0 (StepLr with gamma 0): the weights, and with them the
  // test loss, stay exactly as after epoch 1.
  s.trainer = std::make_unique<Trainer>(s.model, s.opt, std::make_shared<optim::StepLr>(2, 0.0f));
  EarlyStoppingOptions o;
  o.patience = 2;
  auto es = std::make_shared<EarlyStopping>(o);
  s.trainer->add_callback(es);
  FitOptions f;
  f.epochs = 10;
  f.batch_size = 32;
  FitResult r = s.trainer->fit(train, &test, f);
  ASSERT_EQ(r.history.size(), 4u);  // epochs 2 and 3 without improvement
  EXPECT_EQ(es->stopped_epoch(), 3);
  EXPECT_EQ(es->best_epoch(), 1);
  EXPECT_EQ(r.history[2].test_loss, r.history[1].test_loss);
  EXPECT_DOUBLE_EQ(es->best(), r.history[1].test_loss);
  EXPECT_EQ(r.steps, 4 * (320 / 32));
  EXPECT_EQ(s.trainer->state().epoch, 4);
}

TEST(EarlyStopping, RestoreBestWeightsInFit) {
  auto train = blobs(320, 1), test = blobs(200, 2);
  Rig s = make();
  mislabel_after(*s.trainer, 3);
  auto record = std::make_shared<RecordParams>();
  s.trainer->add_callback(record);
  EarlyStoppingOptions o;
  o.patience = 2;
  o.restore_best_weights = true;
  auto es = std::make_shared<EarlyStopping>(o);
  s.trainer->add_callback(es);
  FitOptions f;
  f.epochs = 10;
  f.batch_size = 32;
  FitResult r = s.trainer->fit(train, &test, f);
  ASSERT_GE(es->stopped_epoch(), 0);
  EXPECT_LT(r.history.size(), 10u);
  // The best epoch is the one with the lowest test loss, before the wrong labels.
  std::size_t argmin = 0;
  for (std::size_t i = 1; i < r.history.size(); ++i)
    if (r.history[i].test_loss < r.history[argmin].test_loss) argmin = i;
  EXPECT_EQ(es->best_epoch(), static_cast<std::int64_t>(argmin));
  EXPECT_LT(es->best_epoch(), 3);
  EXPECT_EQ(es->stopped_epoch(), es->best_epoch() + 2);
  EXPECT_NE(record->at_epoch.at(es->stopped_epoch()), record->at_epoch.at(es->best_epoch()));
  EXPECT_EQ(flat_params(*s.model), record->at_epoch.at(es->best_epoch()));
  EXPECT_DOUBLE_EQ(s.trainer->evaluate(test).loss, es->best());
}

// A run killed after its best epoch and restarted from its backup stops where, and with the
// weights, an uninterrupted run does: EarlyStopping's best, patience and best weights travel in
// the backup. They started afresh: the restarted run took a later epoch for its best, stopped
// later and ended on other weights.
TEST(EarlyStopping, ARestartFromABackupStopsAsAnUninterruptedRun) {
  auto train = blobs(320, 1), test = blobs(200, 2);
  EarlyStoppingOptions o;
  o.patience = 2;
  o.restore_best_weights = true;
  TempDir dir;
  FitOptions f;
  f.epochs = 10;
  f.batch_size = 32;  // 10 steps an epoch
  f.backup_dir = dir / "backup";
  f.backup_every_steps = 1;
  const auto run = [&](std::int64_t kill_at) {
    Rig s = make();
    mislabel_after(*s.trainer, 3);
    auto es = std::make_shared<EarlyStopping>(o);
    s.trainer->add_callback(es);
    struct Kill : Callback {
      std::int64_t at;
      explicit Kill(std::int64_t a) : at(a) {}
      void on_batch_end(Trainer&, const BatchLogs& b) override {
        if (b.global_step == at) throw std::runtime_error("killed");
      }
    };
    s.trainer->add_callback(std::make_shared<Kill>(kill_at));
    try {
      s.trainer->fit(train, &test, f);
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "killed");
    }
    return std::tuple{flat_params(*s.model), es->best_epoch(), es->stopped_epoch()};
  };
  const auto [straight, best, stopped] = run(-1);
  ASSERT_GE(stopped, 0);
  ASSERT_LT(best, 3);
  run(best * 10 + 15);  // killed mid-way through the epoch after the best
  const auto [restarted, best_again, stopped_again] = run(-1);
  EXPECT_EQ(best_again, best);
  EXPECT_EQ(stopped_again, stopped);
  EXPECT_EQ(restarted, straight);
}

// Two EarlyStoppings keep their state apart in a backup (it was written under one name: the
// second's best weights collided with the first's, and every backup after a best failed).
TEST(EarlyStopping, TwoInOneRunKeepTheirBackupStateApart) {
  auto train = blobs(320, 1), test = blobs(200, 2);
  TempDir dir;
  Rig s = make();
  EarlyStoppingOptions by_loss, by_accuracy;
  by_loss.restore_best_weights = by_accuracy.restore_best_weights = true;
  by_loss.patience = by_accuracy.patience = 5;
  by_accuracy.monitor = "test_accuracy";
  s.trainer->add_callback(std::make_shared<EarlyStopping>(by_loss));
  s.trainer->add_callback(std::make_shared<EarlyStopping>(by_accuracy));
  FitOptions f;
  f.epochs = 2;
  f.batch_size = 32;
  f.backup_dir = dir / "backup";
  f.backup_every_steps = 3;
  f.keep_backup = true;
  EXPECT_EQ(s.trainer->fit(train, &test, f).history.size(), 2u);
  const TrainerState saved = read_checkpoint_state(dir / "backup");
  EXPECT_EQ(saved.metadata.count("callback 0 early_stopping best"), 1u);
  EXPECT_EQ(saved.metadata.count("callback 1 early_stopping best"), 1u);
}

TEST(EarlyStopping, UnavailableMonitorIsAnError) {
  auto train = blobs(64, 1);
  Rig s = make();
  s.trainer->add_callback(std::make_shared<EarlyStopping>(EarlyStoppingOptions{}));
  FitOptions f;
  f.epochs = 3;
  f.batch_size = 32;
  try {
    s.trainer->fit(train, nullptr, f);  // no evaluation data: test_loss is -1
    FAIL() << "fit without evaluation data accepted monitor test_loss";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'test_loss'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.trainer->state().epoch, 0);  // at the first epoch's end

  // Training metrics are always there.
  Rig t = make();
  EarlyStoppingOptions o;
  o.monitor = "train_loss";
  o.patience = 5;
  auto es = std::make_shared<EarlyStopping>(o);
  t.trainer->add_callback(es);
  EXPECT_EQ(t.trainer->fit(train, nullptr, f).history.size(), 3u);
  EXPECT_EQ(es->stopped_epoch(), -1);
}

// ---- BestModelCheckpoint --------------------------------------------------------------------

TEST(BestModelCheckpoint, KeepsOnlyTheBestEpoch) {
  auto train = blobs(320, 1), test = blobs(200, 2);
  TempDir dir;
  Rig s = make();
  mislabel_after(*s.trainer, 3);
  auto record = std::make_shared<RecordParams>();
  s.trainer->add_callback(record);
  auto best = std::make_shared<BestModelCheckpoint>(dir.path(), "test_loss");
  s.trainer->add_callback(best);
  FitOptions f;
  f.epochs = 5;
  f.batch_size = 32;
  const std::int64_t steps_per_epoch = 320 / 32;
  FitResult r = s.trainer->fit(train, &test, f);
  ASSERT_EQ(r.history.size(), 5u);
  std::size_t argmin = 0;
  for (std::size_t i = 1; i < r.history.size(); ++i)
    if (r.history[i].test_loss < r.history[argmin].test_loss) argmin = i;
  const auto best_epoch = static_cast<std::int64_t>(argmin);
  ASSERT_EQ(best->best_epoch(), best_epoch);
  EXPECT_LT(best_epoch, 4);  // not simply the last epoch
  EXPECT_DOUBLE_EQ(best->best(), r.history[argmin].test_loss);

  std::vector<std::string> kept;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.is_directory()) kept.push_back(e.path().filename().string());
  const std::string name = "ckpt-" + std::to_string((best_epoch + 1) * steps_per_epoch);
  EXPECT_EQ(kept, std::vector<std::string>{name});
  EXPECT_EQ(best->last_saved(), dir / name);

  // Loading the root gives that epoch, as "start of the next epoch", with its weights.
  auto model = make_model(99);
  TrainerState st = load_checkpoint(dir.path(), *model, nullptr);
  EXPECT_EQ(st.epoch, best_epoch + 1);
  EXPECT_EQ(st.step_in_epoch, 0);
  EXPECT_EQ(st.global_step, (best_epoch + 1) * steps_per_epoch);
  EXPECT_TRUE(st.iterator_state.empty());
  EXPECT_EQ(flat_params(*model), record->at_epoch.at(best_epoch));
  auto opt = std::make_shared<optim::SGD>(model->named_parameters(), optim::SgdOptions{0.05f});
  Trainer reloaded(model, opt);
  EXPECT_DOUBLE_EQ(reloaded.evaluate(test).loss, best->best());
}

// A run continued from its checkpoint starts from the best the directory records: a worse epoch
// after the restart does not replace it (it did: the best restarted from the worst value, and the
// one checkpoint kept was the worse one). A fresh run into that directory is refused.
TEST(BestModelCheckpoint, AContinuedRunMustBeatTheRecordedBest) {
  auto train = blobs(320, 1), test = blobs(200, 2);
  TempDir dir;
  FitOptions f;
  f.epochs = 3;
  f.batch_size = 32;
  f.checkpoint_dir = dir / "ck";
  Rig s = make();
  auto first = std::make_shared<BestModelCheckpoint>(dir / "best", "test_loss");
  s.trainer->add_callback(first);
  s.trainer->fit(train, &test, f);
  const double best = first->best();
  const std::string weights = io::read_file(first->last_saved() + "/model.safetensors");

  Rig t = make();
  mislabel_after(*t.trainer, 3);  // the epochs after the restart get worse
  auto second = std::make_shared<BestModelCheckpoint>(dir / "best", "test_loss");
  t.trainer->add_callback(second);
  FitOptions more = f;
  more.epochs = 5;
  more.resume_from = dir / "ck";
  const FitResult r = t.trainer->fit(train, &test, more);
  ASSERT_EQ(r.history.size(), 2u);
  ASSERT_GT(r.history[0].test_loss, best);
  EXPECT_DOUBLE_EQ(second->best(), best);
  EXPECT_EQ(second->last_saved(), first->last_saved());
  EXPECT_EQ(io::read_file(first->last_saved() + "/model.safetensors"), weights);

  Rig fresh = make();
  fresh.trainer->add_callback(std::make_shared<BestModelCheckpoint>(dir / "best", "test_loss"));
  FitOptions again;
  again.batch_size = 32;
  try {
    fresh.trainer->fit(train, &test, again);
    FAIL() << "a fresh run replaced an earlier run's best";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is an earlier run's best"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(io::read_file(first->last_saved() + "/model.safetensors"), weights);
}

// Two runs writing their best into one directory would replace each other's (one is kept): the
// second is refused before it trains, as for checkpoint_dir, and the lock goes with the run.
TEST(BestModelCheckpoint, ASecondRunOnTheSameDirectoryIsRefused) {
  auto train = blobs(64, 1), test = blobs(32, 2);
  TempDir dir;
  FitOptions f;
  f.batch_size = 32;
  {
    DirectoryLock other_run(dir / "best", "best_checkpoint_dir");
    Rig s = make();
    s.trainer->add_callback(std::make_shared<BestModelCheckpoint>(dir / "best", "test_loss"));
    try {
      s.trainer->fit(train, &test, f);
      FAIL() << "a second run wrote into a locked best_checkpoint_dir";
    } catch (const DirectoryBusy& e) {
      EXPECT_NE(std::string(e.what()).find("best_checkpoint_dir " + dir / "best"),
                std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(holds_checkpoints(dir / "best"));
  }
  Rig s = make();
  auto best = std::make_shared<BestModelCheckpoint>(dir / "best", "test_loss");
  s.trainer->add_callback(best);
  s.trainer->fit(train, &test, f);
  EXPECT_TRUE(holds_checkpoints(dir / "best"));
  EXPECT_FALSE(std::filesystem::exists(dir / "best/" + DirectoryLock::kFileName));
}

TEST(BestModelCheckpoint, AccuracyByDefaultAndNeedsItsMetric) {
  auto train = blobs(320, 1), test = blobs(200, 2);
  TempDir dir;
  Rig s = make();
  auto best = std::make_shared<BestModelCheckpoint>(dir / "best");
  s.trainer->add_callback(best);
  FitOptions f;
  f.epochs = 3;
  f.batch_size = 32;
  FitResult r = s.trainer->fit(train, &test, f);
  double max_acc = -1;
  for (const auto& e : r.history) max_acc = std::max(max_acc, e.test_accuracy);
  EXPECT_DOUBLE_EQ(best->best(), max_acc);
  EXPECT_TRUE(std::filesystem::exists(dir / "best/latest"));

  Rig t = make();
  t.trainer->add_callback(std::make_shared<BestModelCheckpoint>(dir / "none"));
  try {
    t.trainer->fit(train, nullptr, f);
    FAIL() << "fit without evaluation data accepted monitor test_accuracy";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'test_accuracy'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "none/latest"));
}

}  // namespace
}  // namespace hpm::train
