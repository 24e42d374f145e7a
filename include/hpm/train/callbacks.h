// Standard callbacks: a progress display (a bar on a terminal, plain lines otherwise), a CSV
// metrics log, and Keras' EarlyStopping and ModelCheckpoint(save_best_only) on an epoch metric.
#pragma once
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "hpm/train/directory_lock.h"
#include "hpm/train/trainer.h"

namespace hpm::train {

struct ProgressOptions {
  std::int64_t epochs = 1;
  std::int64_t every = 200;  // plain mode: a line every this many steps
  // Training by steps (FitOptions::by_steps): "step 1250/2000" over the whole run rather than
  // "epoch 3/8", each evaluation as "val loss ...", and ETA to the last step.
  std::int64_t total_steps = 0;
  // > 0: the rate in tokens/s, each sample holding this many (a language model's block size).
  std::int64_t tokens_per_sample = 0;
};

class ProgressCallback : public Callback {
 public:
  // `tty` chooses the redrawn bar; plain mode prints a line every `every` steps and per epoch.
  ProgressCallback(std::FILE* out, bool tty, std::int64_t epochs, std::int64_t every = 200);
  ProgressCallback(std::FILE* out, bool tty, const ProgressOptions& options);
  void on_epoch_begin(Trainer&, std::int64_t epoch) override;
  void on_batch_end(Trainer&, const BatchLogs& b) override;
  void on_epoch_end(Trainer&, const EpochLogs& e) override;

 private:
  void step_line(const BatchLogs& b, std::chrono::steady_clock::time_point now);
  void step_summary(const EpochLogs& e);
  std::string rate(double samples_per_s) const;  // "1234 samples/s" or "56789 tokens/s"

  std::FILE* out_;
  bool tty_;
  ProgressOptions options_;
  std::int64_t steps_this_epoch_ = 0;  // seen by this callback: a resumed stretch starts mid-way
  std::chrono::steady_clock::time_point last_draw_, epoch_start_;
};

//
// A fresh run starts the file anew; a continued one (from a checkpoint or a backup) keeps the rows
// of the epochs it had finished and writes on after them, so that preemptions lose no history (a
// row of an epoch after the restore point, which the run will redo, is dropped).
class CsvLogger : public Callback {
 public:
  explicit CsvLogger(const std::string& path);  // throws io::IoError if it cannot be created
  void on_train_begin(Trainer& t) override;
  void on_epoch_end(Trainer&, const EpochLogs& e) override;

 private:
  std::string path_;
  std::ofstream out_;
  bool header_written_ = false;  // at the first epoch, when the objective's metrics are known
  std::vector<std::string> extra_;
};

// ---- Watching one epoch metric ---------------------------------------------------------------
// The metrics a callback can monitor, as EpochLogs names them.
inline constexpr const char* kMonitors[] = {"test_loss", "test_accuracy", "train_loss",
                                            "train_accuracy"};
bool is_monitor(const std::string& monitor);
// "min" or "max" for `mode` ("min", "max", or "auto": max for an accuracy, min for a loss); throws
// std::invalid_argument naming a monitor or mode that is not known.
std::string resolve_mode(const std::string& monitor, const std::string& mode);
// The monitored value in `logs`. Throws std::invalid_argument naming the monitor when it is not
// available (test metrics are -1 when fit was given no evaluation data).
double monitored_value(const EpochLogs& logs, const std::string& monitor);

struct EarlyStoppingOptions {
  std::string monitor = "test_loss";
  std::string mode = "auto";  // min | max | auto
  double min_delta = 0.0;     // a change smaller than this is not an improvement
  std::int64_t patience = 0;  // epochs without improvement before stopping (Keras: 0)
  bool restore_best_weights = false;
};

// Stops fit once the monitored metric has not improved for `patience` epochs. With
// restore_best_weights, a copy of the best epoch's state_dict is kept in memory and loaded back
// into the model when fit ends (stopped or not), as Keras 3 does. Restoring at the end rather
// than at the stopping epoch keeps checkpoints written for that epoch true to the trained state.
// Under a Strategy only the primary copy (what is evaluated and checkpointed) is restored.
// Every worker of a multi-worker job must run it: they see the same metrics and so stop together.
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions options);  // throws std::invalid_argument
  void on_train_begin(Trainer&) override;
  void on_epoch_end(Trainer& trainer, const EpochLogs& e) override;
  void on_train_end(Trainer& trainer, const FitResult&) override;
  // Its best, the best's epoch and weights, and the epochs waited, across a restart from a backup:
  // a restarted run stops where and as an uninterrupted one would.
  void save_state(std::map<std::string, std::string>& metadata,
                  nn::NamedTensors& tensors) const override;
  void restore_state(const std::map<std::string, std::string>& metadata,
                     const nn::NamedTensors& tensors) override;

  std::int64_t stopped_epoch() const { return stopped_epoch_; }  // 0-based; -1 = did not stop
  std::int64_t best_epoch() const { return best_epoch_; }        // 0-based; -1 = no epoch yet
  double best() const { return best_; }
  const std::string& mode() const { return mode_; }  // resolved: min or max

 private:
  EarlyStoppingOptions options_;
  std::string mode_;
  double best_ = 0;
  std::int64_t best_epoch_ = -1, stopped_epoch_ = -1, wait_ = 0;
  nn::NamedTensors best_weights_;  // clones, not views of the live parameters
};

// Keras' ModelCheckpoint(save_best_only=True): after each epoch whose monitored metric improves
// on the best so far, saves model, optimizer and trainer state into `dir` with save_checkpoint
// (keep = 1, so `dir/latest` is always the best epoch and `hpm evaluate --checkpoint dir` or
// `--resume dir` start from it). The state is "start of the next epoch", as the trainer's own
// epoch-end checkpoints. Only one process may write `dir`: add it on worker 0 only.
class BestModelCheckpoint : public Callback {
 public:
  // Throws std::invalid_argument for an unknown monitor or mode.
  BestModelCheckpoint(std::string dir, std::string monitor = "test_accuracy",
                      const std::string& mode = "auto");
  // A continued run starts from the best its directory records (saved with each best checkpoint);
  // a fresh run into a directory that holds a best checkpoint, or one that records no best by this
  // monitor, is an InputError, as replacing it could lose a better model.
  // The directory is locked from here to on_train_end (or this callback's end): a second run
  // writing its best into it is refused (DirectoryBusy), as with checkpoint_dir.
  void on_train_begin(Trainer&) override;
  void on_epoch_end(Trainer& trainer, const EpochLogs& e) override;
  void on_train_end(Trainer&, const FitResult&) override;

  double best() const { return best_; }
  std::int64_t best_epoch() const { return best_epoch_; }        // 0-based; -1 = none saved
  const std::string& last_saved() const { return last_saved_; }  // the ckpt-* directory

 private:
  std::string dir_, monitor_, mode_;
  DirectoryLock lock_;
  double best_ = 0;
  std::int64_t best_epoch_ = -1;
  std::string last_saved_;
};

}  // namespace hpm::train
