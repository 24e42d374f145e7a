// Trainer: fit / evaluate / predict for a classifier, in the manner of Keras' Model.fit, with
// callbacks (progress, CSV log, checkpoints) and exact resume from a checkpoint.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hpm/autograd/autocast.h"
#include "hpm/data/dataset.h"
#include "hpm/data/in_memory.h"
#include "hpm/distribute/strategy.h"
#include "hpm/nn/module.h"
#include "hpm/optim/lr_schedule.h"
#include "hpm/optim/optimizer.h"
#include "hpm/train/checkpoint.h"

namespace hpm::train {

// A non-finite loss or another condition that makes continuing pointless.
class TrainingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The training step does not fit the device's memory budget (the message says what it needs and
// what to try). A TrainingError, but not a non-finite loss.
class OutOfMemoryStop : public TrainingError {
 public:
  using TrainingError::TrainingError;
};

// The input cannot train: it yields no batch, its batches are not (inputs, labels), or a saved
// position counts batches of another size. Bad input, not a failed training.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct FitOptions {
  std::int64_t epochs = 1;
  // For fit(LabelledData): how to batch it. For fit(Dataset): the batch size the dataset was
  // built with. Either way it is recorded in checkpoints and backups, and continuing one saved
  // mid-epoch with another batch size is an InputError (its position counts batches).
  std::int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = true;  // as the peer scripts: every step sees a full batch
  std::uint64_t seed = 0;
  float label_smoothing = 0.0f;
  float clip_grad_norm = 0.0f;  // 0 = off
  // Gradient accumulation: each batch runs as this many micro-batches (distribute::micro_batches),
  // one optimizer step per batch, the update the whole batch's (see StrategyOptions).
  int accumulation_steps = 1;
  // Mixed precision of the training steps, with or without a strategy (autograd/autocast.h).
  // Evaluation computes in f32.
  autograd::Precision precision = autograd::Precision::F32;
  bool schedule_per_step = false;  // the LR schedule's t: global step, else epoch
  std::int64_t eval_batch_size = 1000;
  std::string checkpoint_dir;         // empty = no checkpoints
  std::int64_t checkpoint_every = 1;  // epochs
  // A checkpoint root or ckpt-* directory to continue from, unless backup_dir holds a backup
  // (this run's, interrupted), which is restored instead.
  std::string resume_from;

  // BackupAndRestore (Keras' semantics): everything needed to continue exactly (model, optimizer,
  // epoch and step, the default generator, the input pipeline's position) is backed up in
  // `backup_dir` every `backup_every_steps` steps (0: at each epoch end), at each epoch end, and
  // when preempted. fit() first restores the newest usable backup there (a corrupt newest one is
  // skipped and reported), so the same command run again continues where the last one stopped.
  // The previous backup stays until the new one is complete; after a successful finish the
  // backup is removed unless `keep_backup`. In a multi-worker job worker 0 writes it.
  std::string backup_dir;
  std::int64_t backup_every_steps = 0;
  bool keep_backup = false;
  // Preemption: once this reads true (set by a SIGTERM handler, say), fit() finishes the step in
  // progress, writes a backup and returns with FitResult::preempted. Every worker of a
  // multi-worker job stops after the same step.
  const std::atomic<bool>* stop_signal = nullptr;
  // Workers read different shards: a worker other than 0 finds its place in a restored epoch by
  // skipping as many batches as were trained (worker 0's saved position is not its own).
  bool per_worker_input = false;
  // Recorded in every checkpoint and backup (TrainerState::metadata). A run continued from one
  // that recorded another value under one of these keys is refused (an InputError naming both):
  // the CLI records the tokenizer, whose ids the weights were trained to mean.
  std::map<std::string, std::string> metadata;
  // Recorded beside `metadata` but never compared: what describes the run for readers of its
  // checkpoints (the CLI: the resolved configuration), which a continued run may change.
  std::map<std::string, std::string> description;
  // What fixes the order of the training data beside the batch size and seed (the CLI: [data]
  // source, files, shuffle, shuffle_buffer, train_limit, drop_remainder), recorded beside
  // `metadata`. A run continued mid-epoch from a checkpoint that recorded another value under one
  // of these keys is refused (InputError naming both), as its restored position would count other
  // data; at an epoch's end they may change.
  std::map<std::string, std::string> input_order;
  // Training by steps (a language model): each epoch is a stretch of the dataset's cardinality
  // (which must be known) in steps between evaluations, `epochs` stretches in all, and the data
  // is a function of the global step (data::random_windows). A resumed or restored run takes its
  // epoch and step in it from the saved global step, so one continued with stretches of another
  // length (eval_every) still ends after epochs x stretch steps.
  bool by_steps = false;
  // With by_steps: the run ends after this many steps in all (the global step), the last stretch
  // cut short where the stretch length does not divide it, and `epochs` is ignored. 0: epochs x
  // stretch steps.
  std::int64_t max_steps = 0;
};

struct EpochLogs {
  std::int64_t epoch = 0;
  double train_loss = 0, train_accuracy = 0;
  // Whatever the objective names ("loss", "accuracy"; "token_accuracy", "perplexity"; ...), over
  // the epoch's training steps and every replica, derived metrics included.
  nn::Metrics train_metrics;
  double test_loss = -1, test_accuracy = -1;  // -1 when no evaluation data
  nn::Metrics test_metrics;      // the evaluating objective's (empty when no evaluation data)
  std::int64_t global_step = 0;  // steps trained in all when the epoch (or stretch) ended
  // samples_per_s: rows over the training steps' own time (forward, backward, update: what the
  // PyTorch peers time); seconds: the epoch's wall time before its evaluation (input waits and
  // callbacks included).
  double samples_per_s = 0, seconds = 0, lr = 0;
  double input_bound = 0;  // share of the epoch's wall time spent waiting for the next batch
};

struct BatchLogs {
  std::int64_t epoch = 0, step_in_epoch = 0, steps_per_epoch = 0, global_step = 0;
  double loss = 0, running_loss = 0, running_accuracy = 0, samples_per_s = 0;
  nn::Metrics running_metrics;  // the objective's, over the epoch so far, derived ones included
};

// "loss 0.4123 acc 0.8512" for classification, "loss 2.1034 token_acc 0.3921 ppl 8.19" for a
// language model: each metric an objective names, the common ones abbreviated.
std::string metrics_text(const nn::Metrics& metrics);

struct EvalResult {
  double loss = 0, accuracy = 0;  // accuracy: top-1, of rows or (language models) of tokens
  std::int64_t samples = 0;
  nn::Metrics metrics;  // the evaluating objective's, derived ones included ("perplexity")
};

struct FitResult {
  std::vector<EpochLogs> history;
  std::int64_t steps = 0;  // optimizer steps taken in this call
  std::int64_t train_samples = 0;
  double train_seconds = 0;         // time inside training steps (no evaluation)
  double seconds = 0;               // wall time of fit
  std::size_t step_peak_bytes = 0;  // max Device bytes a training step added over its start
  // The most the training Device held during any step, the model and optimizer state included
  // (PyTorch's torch.cuda.max_memory_allocated over the steps).
  std::size_t device_peak_bytes = 0;
  double input_wait_seconds = 0;  // waiting for batches from the input pipeline
  std::string last_checkpoint;
  bool preempted = false;           // stopped by stop_signal; a backup was written
  std::string restored_from;        // the backup this run continued from, if any
  std::int64_t backups = 0;         // backups written
  double backup_seconds = 0;        // time spent writing them
  std::uintmax_t backup_bytes = 0;  // size of the last one
  double samples_per_s() const { return train_seconds > 0 ? train_samples / train_seconds : 0; }
  // This call's first step (oneDNN's kernels are made then; torch.compile's peers skip theirs):
  // its time and rows, and the rate of the steps after it (0 with fewer than two steps).
  double first_step_seconds = 0;
  std::int64_t first_step_samples = 0;
  double samples_per_s_after_first() const {
    const double s = train_seconds - first_step_seconds;
    return steps > 1 && s > 0 ? static_cast<double>(train_samples - first_step_samples) / s : 0;
  }
};

class Trainer;

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_train_begin(Trainer&) {}
  // fit() continued from backup `dir`, after skipping the newer, unusable ones ("DIR: why").
  virtual void on_backup_restored(Trainer&, const std::string& /*dir*/,
                                  const std::vector<std::string>& /*skipped*/) {}
  virtual void on_epoch_begin(Trainer&, std::int64_t /*epoch*/) {}
  // Before the step of `global_step` (counted from 0), its batch already read.
  virtual void on_batch_begin(Trainer&, std::int64_t /*global_step*/) {}
  virtual void on_batch_end(Trainer&, const BatchLogs&) {}
  virtual void on_epoch_end(Trainer&, const EpochLogs&) {}
  virtual void on_train_end(Trainer&, const FitResult&) {}
  // What this callback carries across a restart to decide as an uninterrupted run would
  // (EarlyStopping's best and patience, its best weights): written with every backup, scalars
  // into `metadata` and tensors into `tensors` (the Trainer prefixes each callback's names with
  // its place, so two of one kind keep theirs apart); given back
  // by restore_state when fit restarts from its backup, after on_train_begin (a run resumed from a
  // checkpoint is a new fit, whose callbacks start afresh as Keras').
  virtual void save_state(std::map<std::string, std::string>& /*metadata*/,
                          nn::NamedTensors& /*tensors*/) const {}
  virtual void restore_state(const std::map<std::string, std::string>& /*metadata*/,
                             const nn::NamedTensors& /*tensors*/) {}
};

using nn::LossFn;
// A loss that also sees the batch's inputs: distillation runs its teachers on the same batch.
using InputLossFn =
    std::function<Tensor(const Tensor& inputs, const Tensor& logits, const Tensor& labels)>;

class Trainer {
 public:
  Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
          std::shared_ptr<optim::LrSchedule> schedule = nullptr);
  // Trains through a distribution strategy whose scope() has built the replicas: each batch is
  // one global batch, split among the replicas in sync. Evaluation, prediction and checkpoints
  // use the strategy's primary copy of the variables; only worker 0 writes checkpoints.
  Trainer(std::shared_ptr<distribute::Strategy> strategy,
          std::shared_ptr<optim::LrSchedule> schedule = nullptr);

  // `train` yields (inputs, labels) batches; each epoch runs a new iterator (make_iterator(epoch)),
  // and a mid-epoch checkpoint saves the iterator's state.
  FitResult fit(const data::Dataset& train, const data::LabelledData* test,
                const FitOptions& options);
  // In-memory data: batches of options.batch_size, shuffled from (seed, epoch) when
  // options.shuffle.
  FitResult fit(const data::LabelledData& train, const data::LabelledData* test,
                const FitOptions& options);
  EvalResult evaluate(const data::LabelledData& data, std::int64_t batch_size = 1000);
  Tensor predict(const Tensor& inputs, std::int64_t batch_size = 1000);  // logits

  // Where the model trains (a GPU, "cuda:0"; the CPU by default): moves the model's parameters
  // and buffers there now; each batch goes there as its step begins, and the step's new tensors
  // (optimizer state, masks) are made there. Checkpoints hold host bytes, so a run saved on one
  // device continues on another. Not with a strategy (it places its replicas itself): throws
  // std::invalid_argument.
  void set_device(Device& device);
  Device& device() const { return device_ != nullptr ? *device_ : Device::cpu(); }

  void add_callback(std::shared_ptr<Callback> cb) { callbacks_.push_back(std::move(cb)); }
  // What a batch's loss and metrics are (default: Classification with the fit options' label
  // smoothing). Runs on one device and under every strategy alike.
  void set_objective(std::shared_ptr<const nn::Objective> objective) {
    objective_ = std::move(objective);
  }
  // Shorthands for a FunctionObjective: a loss of (logits, labels), or of (inputs, logits, labels)
  // (distillation's teachers run on the inputs).
  void set_loss(LossFn loss);
  void set_input_loss(InputLossFn loss);
  // The metrics of the last training step, over every replica in sync.
  const nn::Metrics& last_step_metrics() const { return last_metrics_; }
  void stop_training() { stop_ = true; }  // from a callback: ends fit after this batch
  const TrainerState& state() const { return state_; }
  nn::Module& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  double train_step(const Tensor& x, const Tensor& y, std::int64_t* correct);
  nn::Metrics with_derived(const nn::Metrics& m) const;  // plus the objective's derived ones
  // After the first step ran out of device memory: runs it again with the budget lifted to
  // measure what it needs, and says so (TrainingError). With replicas in sync it only names the
  // budget (and a replica's OOM surfaces once its peers' all-reduce times out).
  [[noreturn]] void explain_out_of_memory(const Tensor& x, const Tensor& y,
                                          const OutOfMemoryError& error);
  void set_lr(float lr);
  TrainerState state_to_save(data::Iterator* it, bool epoch_done) const;
  void write_backup(data::Iterator* it, bool epoch_done, FitResult& result);
  bool is_chief() const;  // writes checkpoints and backups
  bool stop_signalled() const;
  // Throws TrainingError if the last step's update was skipped for gradients that are not finite
  // (Optimizer::updates_halted). A single-device step reads the verdict of the step before it
  // after its own wait for the device, so that the update is issued without one; before anything
  // reads the model as trained (backups, the epoch's end) the verdict is read here. `halted`: the
  // verdict as the caller already read it (with a step's loss).
  void check_last_update(std::optional<bool> halted = std::nullopt);
  // Brings every worker's copy up to date (Strategy::synchronize) and records the replicas'
  // generators for what is saved next. Collective: at the epoch's end and before each backup.
  void synchronize_strategy();
  // The callbacks' state (Callback::save_state) into a backup, each under its place's prefix, and
  // back into them when a run restarts from one.
  void save_callback_state(TrainerState& s) const;
  void restore_callback_state(const std::map<std::string, std::string>& metadata,
                              const nn::NamedTensors& tensors);

  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  std::shared_ptr<optim::LrSchedule> schedule_;
  std::shared_ptr<distribute::Strategy> strategy_;  // null: the model trains on the caller's thread
  std::shared_ptr<const nn::Objective> objective_;
  Device* device_ = nullptr;  // null: the CPU
  nn::Metrics last_metrics_;
  FitOptions options_;
  TrainerState state_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  float base_lr_;
  bool stop_ = false;
  bool stop_agreed_ = false;  // the last step ended with a stop request (from any worker)
  // The step whose update's verdict check_last_update has not read yet, as state_ was before it.
  struct StepPosition {
    std::int64_t epoch, step_in_epoch, global_step;
  };
  std::optional<StepPosition> unverified_update_;
  std::vector<Generator::State> replica_rngs_;  // as of the last synchronize_strategy
};

}  // namespace hpm::train
