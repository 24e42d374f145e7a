#include "hpm/train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "hpm/autograd/autocast.h"
#include "hpm/autograd/grad_mode.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/paths.h"
#include "hpm/nn/losses.h"
#include "hpm/tensor/kernels.h"
#include "hpm/tensor/random.h"
#include "hpm/trace/trace.h"
#include "hpm/train/directory_lock.h"

namespace hpm::train {

namespace {
// The prefix of FitOptions::input_order's keys in a checkpoint's metadata.
const std::string kInputOrder = "input_order ";
}  // namespace

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Whether a backup directory is one hpm made: missing (this run makes it), or holding only what
// an earlier run of hpm left there (its backups, `latest`, the lock file of a run that was
// killed). An empty directory that was already there is the user's.
// "X" or "X and N more", naming one of `count` things in a message.
std::string one_and_more(const std::string& one, std::size_t count) {
  return count > 1 ? one + " and " + std::to_string(count - 1) + " more" : one;
}

bool hpm_made(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return true;
  bool any = false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!is_checkpoint_name(n) && n != "latest" && n != DirectoryLock::kFileName) return false;
    any = true;
  }
  return any;
}

}  // namespace

Trainer::Trainer(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer,
                 std::shared_ptr<optim::LrSchedule> schedule)
    : model_(std::move(model)),
      optimizer_(std::move(optimizer)),
      schedule_(schedule ? std::move(schedule) : std::make_shared<optim::ConstantLr>()),
      base_lr_(optimizer_->lr()) {}

Trainer::Trainer(std::shared_ptr<distribute::Strategy> strategy,
                 std::shared_ptr<optim::LrSchedule> schedule)
    : Trainer(strategy->model(), strategy->optimizer(), std::move(schedule)) {
  strategy_ = std::move(strategy);
}

void Trainer::set_device(Device& device) {
  if (strategy_) {
    throw std::invalid_argument("set_device: a strategy places its replicas itself (" +
                                strategy_->name() + ")");
  }
  model_->move_to(device);
  device_ = &device;
}

void Trainer::set_lr(float lr) {
  if (strategy_)
    strategy_->set_lr(lr);
  else
    optimizer_->set_lr(lr);
}

std::string metrics_text(const nn::Metrics& metrics) {
  static const std::map<std::string, std::string> shorter = {
      {"accuracy", "acc"}, {"token_accuracy", "token_acc"}, {"perplexity", "ppl"}};
  std::ostringstream os;
  os.setf(std::ios::fixed);
  for (const auto& e : metrics.entries()) {
    const auto it = shorter.find(e.name);
    os << (os.tellp() > 0 ? " " : "") << (it == shorter.end() ? e.name : it->second) << ' '
       << std::setprecision(e.name == "perplexity" ? 2 : 4) << e.mean();
  }
  return os.str();
}

nn::Metrics Trainer::with_derived(const nn::Metrics& m) const {
  nn::Metrics out = m;
  if (objective_) objective_->derive(out);
  return out;
}

void Trainer::set_loss(LossFn loss) {
  objective_ = std::make_shared<nn::FunctionObjective>(
      [loss = std::move(loss)](const Tensor& logits, const Tensor&, const Tensor& labels) {
        return loss(logits, labels);
      },
      "loss");
}

void Trainer::set_input_loss(InputLossFn loss) {
  objective_ = std::make_shared<nn::FunctionObjective>(
      [loss = std::move(loss)](const Tensor& logits, const Tensor& inputs, const Tensor& labels) {
        return loss(inputs, logits, labels);
      },
      "input_loss");
}

namespace {

// Whether a step gated on the device reads its loss after issuing its update
// (HPM_LOSS_READ_AFTER_UPDATE=0 at start: at the backward's end, before it, the A/B of the wait
// this saves a GPU).
bool read_after_update() {
  static const bool on = autograd::env_switch_on("HPM_LOSS_READ_AFTER_UPDATE");
  return on;
}

}  // namespace

double Trainer::train_step(const Tensor& x, const Tensor& y, std::int64_t* correct) {
  trace::Span span("train step", "train");
  const nn::Classification by_default(options_.label_smoothing);
  const nn::Objective& objective = objective_ ? *objective_ : by_default;
  std::optional<DeviceGuard> on;
  if (device_ != nullptr) on.emplace(*device_);
  const nn::Batch batch = device_ ? nn::Batch{x.to(*device_), y.to(*device_)} : nn::Batch{x, y};
  const auto stopped = [this](const char* what) {
    std::ostringstream os;
    os << "loss is " << what << " at epoch " << state_.epoch + 1 << ", step "
       << state_.step_in_epoch + 1 << " (global step " << state_.global_step + 1
       << "); stopping without updating the model";
    throw TrainingError(os.str());
  };
  if (strategy_) {
    const distribute::StepResult r =
        strategy_->train_step(batch, objective, options_.clip_grad_norm, stop_signalled());
    stop_agreed_ = r.stop_requested;
    if (!r.finite) stopped("not finite (NaN or Inf on some replica)");
    unverified_update_ = StepPosition{state_.epoch, state_.step_in_epoch, state_.global_step};
    check_last_update();
    last_metrics_ = r.metrics;
    *correct += r.correct;
    return r.loss;
  }
  stop_agreed_ = stop_signalled();
  optimizer_->zero_grad();
  distribute::ReplicaStepOptions o;
  o.micro_batches = options_.accumulation_steps;
  o.precision = options_.precision;
  // Where the optimizer gates its update on the device, the update is issued before the loss is
  // read, and the read, begun after the forward, waits for the forward alone: a GPU runs the
  // backward and the update while the host takes the verdict and issues the next step, instead of
  // idling from the end of the update until the next step's first kernel arrives.
  o.read_later = optimizer_->gates_on_device() && read_after_update();
  if (o.read_later && optimizer_->halted_flag().defined()) {
    o.read_with = {optimizer_->halted_flag()};  // the last update's verdict, read with the loss
  }
  distribute::ReplicaStepResult r = distribute::replica_step(*model_, objective, batch, o);
  if (!o.read_later) {
    check_last_update();  // the step before: its update is done now that this step's loss is read
    if (!r.finite) stopped(std::isnan(r.bad_value) ? "NaN" : "Inf");
    optimizer_->clip_and_step(options_.clip_grad_norm);
  } else {
    for (const Tensor& loss : r.losses) optimizer_->gate_on(loss);
    optimizer_->clip_and_step(options_.clip_grad_norm);
    try {
      r.settle();
    } catch (const std::out_of_range&) {  // a bad index in this step: its update was skipped
      optimizer_->retract_skipped_step();
      throw;
    }
    // The step before's update: its verdict as this step's forward found it (a halt there skipped
    // this step's update too). Without a flag at the step's start no update was gated on the
    // device (reading the flag now would see this step's gate); a step that counted nothing read
    // nothing, and asks the optimizer.
    if (o.read_with.empty()) {
      check_last_update(false);
    } else if (!r.read_with.empty()) {
      check_last_update(r.read_with.front() != 0.0);
    } else {
      check_last_update();
    }
    if (!r.finite) {
      optimizer_->retract_skipped_step();  // the gate skipped it: nothing changed
      stopped(std::isnan(r.bad_value) ? "NaN" : "Inf");
    }
  }
  unverified_update_ = StepPosition{state_.epoch, state_.step_in_epoch, state_.global_step};
  last_metrics_ = r.metrics;
  *correct += std::llround(r.metrics.sum("accuracy"));
  return r.metrics.mean("loss");
}

void Trainer::explain_out_of_memory(const Tensor& x, const Tensor& y,
                                    const OutOfMemoryError& error) {
  Device& device = this->device();
  const std::size_t budget = device.stats().budget_bytes;
  if (budget == Device::kUnlimited) throw error;
  constexpr double kMiB = 1024.0 * 1024.0;
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  if (strategy_ && strategy_->num_replicas_in_sync() > 1) {
    // Replicas in sync cannot run a step again alone to measure it: say what is known.
    os << "the training step does not fit: device '" << device.name() << "' has a budget of "
       << static_cast<double>(budget) / kMiB
       << " MiB; try [memory] recompute, offload or [pipeline] stages (" << error.what() << ")";
    throw OutOfMemoryStop(os.str());
  }
  device.set_budget(Device::kUnlimited);
  // The measurement runs the step for real; what it changes (the parameters, the optimizer's
  // state) is put back after, so a caller that catches the error holds the model it had before
  // (a library caller retrying with a smaller batch trained on one more step without knowing).
  // The copies are on the host; where that is the measured device, their bytes are not the step's.
  const std::size_t before_copies = device.stats().current_bytes;
  const auto host_copy = [](const nn::NamedTensors& tensors) {
    nn::NamedTensors out;
    for (const auto& [name, t] : tensors) {
      Tensor c = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
      c.copy_(t);
      out.emplace_back(name, c);
    }
    return out;
  };
  const nn::NamedTensors model_before = host_copy(model_->state_dict());
  const nn::NamedTensors optimizer_before = host_copy(optimizer_->state());
  const std::size_t copies = device.stats().current_bytes - before_copies;
  const auto put_back = [&] {
    model_->load_state_dict(model_before);
    optimizer_->load_state(optimizer_before);
    unverified_update_.reset();  // undone
    device.set_budget(budget);
  };
  device.reset_peak();
  std::int64_t correct = 0;
  try {
    train_step(x, y, &correct);
  } catch (...) {
    put_back();
    throw;
  }
  const std::size_t need = device.stats().peak_bytes - copies;
  put_back();
  os << "the training step needs " << static_cast<double>(need) / kMiB << " MiB, device '"
     << device.name() << "' has a budget of " << static_cast<double>(budget) / kMiB
     << " MiB; try [memory] recompute, offload or [pipeline] stages (" << error.what() << ")";
  throw OutOfMemoryStop(os.str());
}

FitResult Trainer::fit(const data::LabelledData& train, const data::LabelledData* test,
                       const FitOptions& options) {
  return fit(data::Dataset::batched_slices({train.inputs, train.labels}, options.batch_size,
                                           options.shuffle, options.seed, options.drop_last),
             test, options);
}

// The state to save now: at an epoch boundary (continue with the next epoch), or mid-epoch with
// the input pipeline's position.
TrainerState Trainer::state_to_save(data::Iterator* it, bool epoch_done) const {
  TrainerState s = state_;
  if (epoch_done) {
    ++s.epoch;
    s.step_in_epoch = 0;
  } else {
    data::StateWriter w;
    it->save(w);
    s.iterator_state = w.bytes();
  }
  s.rng = default_generator().state();
  s.replica_rngs = replica_rngs_;
  return s;
}

namespace {
// Callback i's keys in a backup: its own, under a prefix of its place, so that two callbacks of
// one kind (two EarlyStoppings) keep theirs apart.
std::string callback_prefix(std::size_t i) { return "callback " + std::to_string(i) + " "; }
}  // namespace

void Trainer::save_callback_state(TrainerState& s) const {
  for (std::size_t i = 0; i < callbacks_.size(); ++i) {
    std::map<std::string, std::string> metadata;
    nn::NamedTensors tensors;
    callbacks_[i]->save_state(metadata, tensors);
    const std::string prefix = callback_prefix(i);
    for (const auto& [key, value] : metadata) s.metadata[prefix + key] = value;
    for (auto& [name, t] : tensors) s.callback_tensors.emplace_back(prefix + name, t);
  }
}

void Trainer::restore_callback_state(const std::map<std::string, std::string>& metadata,
                                     const nn::NamedTensors& tensors) {
  for (std::size_t i = 0; i < callbacks_.size(); ++i) {
    const std::string prefix = callback_prefix(i);
    std::map<std::string, std::string> mine;
    nn::NamedTensors mine_tensors;
    for (const auto& [key, value] : metadata)
      if (key.rfind(prefix, 0) == 0) mine[key.substr(prefix.size())] = value;
    for (const auto& [name, t] : tensors)
      if (name.rfind(prefix, 0) == 0) mine_tensors.emplace_back(name.substr(prefix.size()), t);
    callbacks_[i]->restore_state(mine, mine_tensors);
  }
}

void Trainer::synchronize_strategy() {
  if (!strategy_) return;
  strategy_->synchronize();
  replica_rngs_ = strategy_->replica_generator_states();  // collective: every worker, here
}

bool Trainer::stop_signalled() const {
  return options_.stop_signal != nullptr && options_.stop_signal->load();
}

bool Trainer::is_chief() const { return !strategy_ || strategy_->worker_rank() == 0; }

void Trainer::check_last_update(std::optional<bool> halted) {
  if (!unverified_update_) return;
  const StepPosition at = *unverified_update_;
  unverified_update_.reset();
  if (!(halted ? *halted : optimizer_->updates_halted())) return;
  std::ostringstream os;
  os << "the gradients are not finite (NaN or Inf; their norm, for clipping, is not) at epoch "
     << at.epoch + 1 << ", step " << at.step_in_epoch + 1 << " (global step " << at.global_step + 1
     << ") although its loss is finite; that step's update was skipped, so the parameters and "
        "optimizer state are as they were before it; stopping";
  throw TrainingError(os.str());
}

void Trainer::write_backup(data::Iterator* it, bool epoch_done, FitResult& result) {
  check_last_update();  // a backup holds only what was trained
  if (options_.backup_dir.empty()) return;
  synchronize_strategy();  // every worker, though only the chief writes
  if (!is_chief()) return;
  trace::Span span("backup", "train");
  const auto t0 = Clock::now();
  TrainerState state = state_to_save(it, epoch_done);
  state.metadata[kCheckpointKind] = kBackup;  // what a restore, the pruning and the end may delete
  save_callback_state(state);                 // what a restart restores (checkpoints start anew)
  const std::string dir = save_checkpoint(options_.backup_dir, *model_, *optimizer_, state, 2);
  result.backup_seconds += since(t0);
  ++result.backups;
  std::uintmax_t bytes = 0;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) bytes += f.file_size(ec);
  result.backup_bytes = bytes;
}

FitResult Trainer::fit(const data::Dataset& train, const data::LabelledData* test,
                       const FitOptions& options) {
  options_ = options;
  distribute::micro_batches(0, options.accumulation_steps);  // validates it before any work
  // Backups are deleted when the run finishes and both prune their oldest: sharing a directory
  // (in any spelling, or one inside the other) would delete checkpoints.
  if (!options.backup_dir.empty() && !options.checkpoint_dir.empty() &&
      io::paths_overlap(options.backup_dir, options.checkpoint_dir)) {
    throw InputError("backup_dir " + options.backup_dir + " and checkpoint_dir " +
                     options.checkpoint_dir +
                     " are the same directory or one holds the other: give each its own");
  }
  // Only the writer locks (in a multi-worker job, worker 0): a second run is refused before it
  // restores, trains or writes anything.
  const bool backup_dir_ours = !options.backup_dir.empty() && hpm_made(options.backup_dir);
  DirectoryLock checkpoint_lock, backup_lock;
  if (is_chief()) {
    if (!options.checkpoint_dir.empty())
      checkpoint_lock = DirectoryLock(options.checkpoint_dir, "checkpoint_dir");
    if (!options.backup_dir.empty()) backup_lock = DirectoryLock(options.backup_dir, "backup_dir");
  }
  if (strategy_) {
    strategy_->set_accumulation_steps(options.accumulation_steps);
    strategy_->set_precision(options.precision);
  }
  stop_ = false;
  stop_agreed_ = false;
  FitResult result;
  const auto t_fit = Clock::now();
  state_ = TrainerState{};
  state_.seed = options.seed;
  std::vector<std::string> skipped_backups;
  // Backups are restored from, pruned and finally deleted: only those a Trainer wrote as backups.
  // Checkpoints of another kind there (an earlier run's checkpoint_dir given as backup_dir) would
  // be taken for this run's and then deleted.
  if (!options.backup_dir.empty() && is_chief()) {
    const std::vector<std::string> others = checkpoints_not_of_kind(options.backup_dir, kBackup);
    if (!others.empty()) {
      throw InputError("backup_dir " + options.backup_dir +
                       " holds checkpoints that are not backups (" +
                       one_and_more(others.front(), others.size()) +
                       "; an earlier run's checkpoint_dir?), which hpm would restore from and "
                       "then delete: continue from them with --resume, or give backup_dir a "
                       "directory of its own");
    }
  }
  // This run's backup first, as Keras' BackupAndRestore: the same command run again after a kill
  // (a restart under hpm launch, --resume in it) continues where the backup stopped, not at the
  // checkpoint it started from. Backups exist only while a run is unfinished.
  std::optional<RestoredCheckpoint> restored;
  if (!options.backup_dir.empty())
    restored = restore_newest_usable(options.backup_dir, *model_, optimizer_.get());
  if (restored) {
    state_ = restored->state;
    result.restored_from = restored->dir;
    skipped_backups = restored->skipped;
  } else if (!options.resume_from.empty()) {
    state_ = load_checkpoint(options.resume_from, *model_, optimizer_.get());
  } else {
    // A corrupt newest backup is reported through on_backup_restored even when an older one is
    // used; with none at all, training starts afresh.
    manual_seed(options.seed);
  }
  // Continued: from this run's own backup, or from a checkpoint (resume_from).
  const bool continuing = !options.resume_from.empty() || !result.restored_from.empty();
  const bool from_checkpoint = result.restored_from.empty() && !options.resume_from.empty();
  const std::string saved = from_checkpoint ? "the checkpoint " + options.resume_from
                                            : "the backup " + result.restored_from;
  if (continuing) {
    // A position mid-epoch counts batches of the size it was saved with: with another size the
    // restored iterator would skip or repeat data (or end the epoch at once).
    if (state_.step_in_epoch > 0 && state_.batch_size > 0 && options.batch_size > 0 &&
        state_.batch_size != options.batch_size) {
      throw InputError(saved + " was saved at step " + std::to_string(state_.step_in_epoch) +
                       " of epoch " + std::to_string(state_.epoch + 1) + " with batch size " +
                       std::to_string(state_.batch_size) + ", but this run's batch size is " +
                       std::to_string(options.batch_size) + ": continue it with batch size " +
                       std::to_string(state_.batch_size) + ", or start afresh");
    }
    // The epoch's order of data comes from the seed: another one would repeat some examples and
    // skip others for the rest of the restored epoch.
    if (state_.step_in_epoch > 0 && state_.seed != options.seed) {
      throw InputError(saved + " was saved at step " + std::to_string(state_.step_in_epoch) +
                       " of epoch " + std::to_string(state_.epoch + 1) + " with seed " +
                       std::to_string(state_.seed) + ", but this run's seed is " +
                       std::to_string(options.seed) + ": continue it with seed " +
                       std::to_string(state_.seed) + ", or start afresh");
    }
    for (const auto& [key, value] : options.input_order) {
      const auto it = state_.metadata.find(kInputOrder + key);
      if (state_.step_in_epoch > 0 && it != state_.metadata.end() && it->second != value) {
        throw InputError(saved + " was saved at step " + std::to_string(state_.step_in_epoch) +
                         " of epoch " + std::to_string(state_.epoch + 1) + " with " + key + " " +
                         it->second + ", but this run has " + key + " " + value +
                         ": its position would count other data (some examples repeated, others "
                         "skipped); continue it with " +
                         key + " " + it->second + ", or change it at an epoch's end");
      }
    }
    for (const auto& [key, value] : options.metadata) {
      const auto it = state_.metadata.find(key);
      if (it != state_.metadata.end() && it->second != value) {
        throw InputError(saved + " was trained with " + key + " " + it->second + ", this run has " +
                         key + " " + value + ": continue it with the same " + key +
                         ", or start afresh");
      }
    }
    default_generator().set_state(state_.rng);
    if (strategy_) {
      strategy_->mirror_from_primary();
      strategy_->set_replica_generator_states(state_.replica_rngs);
    }
  }
  // A fresh run into an earlier run's checkpoints would overwrite them and move `latest`; one
  // continued carries on where they stop.
  if (!continuing && !options.checkpoint_dir.empty() && is_chief() &&
      holds_checkpoints(options.checkpoint_dir)) {
    std::string latest;
    try {
      latest = " (latest " + resolve_checkpoint_dir(options.checkpoint_dir) + ")";
    } catch (const std::exception&) {  // a `latest` that names nothing: say no more
    }
    throw InputError("checkpoint_dir " + options.checkpoint_dir +
                     " already holds checkpoints of an earlier run" + latest +
                     ": resume from it (hpm train --resume " + options.checkpoint_dir +
                     "), or choose another directory; hpm does not overwrite them");
  }
  // A run resumed from an earlier step than checkpoint_dir's newest would write a second history
  // beside the first: a later restore would take the newest step, of either. (A run restored from
  // its own backup replays its own history, and rewrites those checkpoints by name.)
  if (from_checkpoint && !options.checkpoint_dir.empty() && is_chief()) {
    const std::vector<std::int64_t> later =
        checkpoint_steps_after(options.checkpoint_dir, state_.global_step);
    if (!later.empty()) {
      throw InputError(saved + " is at global step " + std::to_string(state_.global_step) +
                       ", but checkpoint_dir " + options.checkpoint_dir +
                       " holds checkpoints of later steps (" +
                       one_and_more("ckpt-" + std::to_string(later.back()), later.size()) +
                       ") that this run's would mix with: move them away, or choose another "
                       "checkpoint_dir; hpm does not overwrite them");
    }
  }
  const std::map<std::string, std::string> restored_metadata = state_.metadata;
  state_.metadata = options.metadata;
  for (const auto& [key, value] : options.description) state_.metadata[key] = value;
  for (const auto& [key, value] : options.input_order) state_.metadata[kInputOrder + key] = value;
  state_.batch_size = options.batch_size;                    // what later saves record
  const std::int64_t steps_per_epoch = train.cardinality();  // may be kUnknown
  if (steps_per_epoch == 0) {
    throw InputError("the training data yields no batch (is it smaller than one batch?)");
  }
  // Training by steps: the epochs are stretches of steps_per_epoch steps between evaluations, and
  // the saved epoch and step in it count stretches of the length of the run that saved them. A run
  // continued with another length (eval_every) takes its place from the global step instead, or
  // it would stop at once (its epoch count already reached) or train past its last step.
  bool replay_position = false;  // find the position in the epoch by skipping batches
  if (options.by_steps && continuing) {
    if (steps_per_epoch <= 0) {
      throw std::invalid_argument(
          "FitOptions::by_steps needs training data of known length (the steps of a stretch)");
    }
    const std::int64_t epoch = state_.global_step / steps_per_epoch,
                       step = state_.global_step % steps_per_epoch;
    if (epoch != state_.epoch || step != state_.step_in_epoch) {
      state_.epoch = epoch;
      state_.step_in_epoch = step;
      state_.iterator_state.clear();  // a position in a stretch of the other length
      replay_position = true;
    }
  }
  // By steps with a step budget: as many stretches as reach it, the last one cut short.
  const std::int64_t epochs = options.by_steps && options.max_steps > 0 && steps_per_epoch > 0
                                  ? (options.max_steps + steps_per_epoch - 1) / steps_per_epoch
                                  : options.epochs;
  const auto budget_spent = [&] {
    return options.by_steps && options.max_steps > 0 && state_.global_step >= options.max_steps;
  };
  // Fail before any work if checkpoints or backups could not be written.
  if (!options.checkpoint_dir.empty()) io::ensure_directory(options.checkpoint_dir);
  if (!options.backup_dir.empty() && is_chief()) io::ensure_directory(options.backup_dir);
  Device& device = this->device();

  for (auto& cb : callbacks_) cb->on_train_begin(*this);
  // A restart from this run's backup continues its callbacks' state (a run resumed from a
  // checkpoint is a new fit: its callbacks start afresh, as Keras').
  if (!result.restored_from.empty())
    restore_callback_state(restored_metadata, state_.callback_tensors);
  state_.callback_tensors.clear();  // each save takes the callbacks' state anew
  if (!result.restored_from.empty()) {
    for (auto& cb : callbacks_)
      cb->on_backup_restored(*this, result.restored_from, skipped_backups);
  }
  for (; state_.epoch < epochs && !stop_ && !budget_spent(); ++state_.epoch) {
    model_->train();
    std::unique_ptr<data::Iterator> it = train.make_iterator(state_.epoch);
    if (state_.step_in_epoch > 0) {
      if (replay_position || (options.per_worker_input && !is_chief())) {
        // Worker 0's saved position is not this worker's, or it was saved in a stretch of another
        // length: replay as many batches.
        data::Element skipped;
        for (std::int64_t k = 0; k < state_.step_in_epoch && it->next(skipped); ++k) {
        }
      } else if (!state_.iterator_state.empty()) {
        data::StateReader reader(state_.iterator_state);
        it->restore(reader);
      }
    }
    state_.iterator_state.clear();
    replay_position = false;
    if (!options.schedule_per_step) set_lr(schedule_->lr(base_lr_, state_.epoch));
    for (auto& cb : callbacks_) cb->on_epoch_begin(*this, state_.epoch);
    EpochLogs logs;
    logs.epoch = state_.epoch;
    double loss_sum = 0.0, epoch_seconds = 0.0, wait_seconds = 0.0;
    nn::Metrics epoch_metrics;
    std::int64_t correct = 0, seen = 0, batches = 0;
    bool epoch_done = false;
    const bool from_start = state_.step_in_epoch == 0;
    const auto epoch_start = Clock::now();
    data::Element batch;
    while (!stop_) {
      if (budget_spent()) {  // the last stretch, cut short: it ends here as if complete
        epoch_done = true;
        break;
      }
      bool got = false;
      {
        trace::Span span("next batch", "load");
        const auto w0 = Clock::now();
        got = it->next(batch);
        wait_seconds += since(w0);
      }
      if (!got) {
        // A whole epoch without a batch (a source of unknown length that is empty or smaller
        // than one batch) would "train" nothing and save the untrained model as a result.
        if (from_start && batches == 0) {
          throw InputError("the training data yields no batch in epoch " +
                           std::to_string(state_.epoch + 1) +
                           " (is it empty, or smaller than one batch?)");
        }
        epoch_done = true;
        break;
      }
      if (batch.size() < 2) throw InputError("training batches need (inputs, labels) components");
      const Tensor& x = batch[0];
      const Tensor& y = batch[1];
      if (options.schedule_per_step) {
        set_lr(schedule_->lr(base_lr_, state_.global_step));
      }
      for (auto& cb : callbacks_) cb->on_batch_begin(*this, state_.global_step);
      const std::size_t before = device.stats().current_bytes;
      device.reset_peak();
      const auto t0 = Clock::now();
      double loss = 0.0;
      try {
        loss = train_step(x, y, &correct);
      } catch (const OutOfMemoryError& e) {
        if (result.steps > 0) throw;
        explain_out_of_memory(x, y, e);
      }
      const double dt = since(t0);
      if (result.steps == 0) {
        result.first_step_seconds = dt;
        result.first_step_samples = x.size(0);
      }
      result.step_peak_bytes = std::max(result.step_peak_bytes, device.stats().peak_bytes - before);
      result.device_peak_bytes = std::max(result.device_peak_bytes, device.stats().peak_bytes);
      epoch_seconds += dt;
      loss_sum += loss;
      seen += x.size(0);
      ++batches;
      ++state_.step_in_epoch;
      ++state_.global_step;
      ++result.steps;
      epoch_metrics.merge(last_metrics_);
      BatchLogs b{state_.epoch,
                  state_.step_in_epoch,
                  steps_per_epoch,
                  state_.global_step,
                  loss,
                  epoch_metrics.has("loss") ? epoch_metrics.mean("loss")
                                            : loss_sum / static_cast<double>(batches),
                  static_cast<double>(correct) / static_cast<double>(seen),
                  static_cast<double>(seen) / epoch_seconds,
                  with_derived(epoch_metrics)};
      for (auto& cb : callbacks_) cb->on_batch_end(*this, b);
      if (stop_agreed_) {  // preempted: every worker stops after this same step
        result.preempted = true;
        stop_ = true;
        // After the epoch's last step, the epoch ends here (evaluation, callbacks, its backup)
        // as it would have: continued, it would otherwise log an epoch of no batches.
        if ((steps_per_epoch > 0 && state_.step_in_epoch >= steps_per_epoch) || budget_spent()) {
          epoch_done = true;
          break;
        }
        write_backup(it.get(), false, result);
        break;
      }
      // Not at the epoch's last step, which the epoch's end backs up as done: a mid-epoch state
      // there would restore into an epoch of no batches.
      const bool epoch_last = steps_per_epoch > 0 && state_.step_in_epoch >= steps_per_epoch;
      if (options.backup_every_steps > 0 && state_.global_step % options.backup_every_steps == 0 &&
          !epoch_last) {
        write_backup(it.get(), false, result);
      }
    }
    // A stop asked for (stop_training) at the epoch's last step ends the epoch as done, as a
    // preemption there does: it was saved as a position past the epoch's end, and the epoch was
    // neither evaluated nor called back.
    if (!epoch_done && stop_ &&
        ((steps_per_epoch > 0 && state_.step_in_epoch >= steps_per_epoch) || budget_spent())) {
      epoch_done = true;
    }
    // What follows reads the whole model (evaluation, callbacks, backups, checkpoints, the caller
    // after the last epoch).
    check_last_update();
    synchronize_strategy();
    result.train_seconds += epoch_seconds;
    result.train_samples += seen;
    result.input_wait_seconds += wait_seconds;
    const double epoch_wall = since(epoch_start);
    logs.input_bound = epoch_wall > 0 ? wait_seconds / epoch_wall : 0.0;
    // An epoch restored after its last batch (an input of unknown length, preempted there) trained
    // on nothing: its training metrics are unknown (NaN, which no monitor takes for a best), not 0.
    const double unknown = std::numeric_limits<double>::quiet_NaN();
    // Weighted by rows (a language model's by counted tokens), as Keras and the epoch's line: a
    // mean over batches weighted a short last batch as a whole one. The accuracy is the
    // objective's own (token_accuracy for a language model, where "accuracy" was always 0).
    logs.train_loss = !batches                    ? unknown
                      : epoch_metrics.has("loss") ? epoch_metrics.mean("loss")
                                                  : loss_sum / static_cast<double>(batches);
    logs.train_accuracy = !seen ? unknown
                          : epoch_metrics.has("token_accuracy") && !epoch_metrics.has("accuracy")
                              ? epoch_metrics.mean("token_accuracy")
                              : static_cast<double>(correct) / static_cast<double>(seen);
    logs.train_metrics = with_derived(epoch_metrics);
    logs.samples_per_s = epoch_seconds > 0 ? static_cast<double>(seen) / epoch_seconds : 0.0;
    // The epoch's wall time (its steps, input waits, callbacks such as codistillation's
    // exchanges, mid-epoch backups; not its evaluation), what `hpm plot --x seconds` adds up: the
    // steps' time alone left out what a run pays besides them.
    logs.seconds = epoch_wall;
    logs.lr = optimizer_->lr();
    if (epoch_done && test != nullptr && test->size() > 0) {
      const EvalResult ev = evaluate(*test, options.eval_batch_size);
      logs.test_loss = ev.loss;
      logs.test_accuracy = ev.accuracy;
      logs.test_metrics = ev.metrics;
    }
    logs.global_step = state_.global_step;
    if (epoch_done) {
      result.history.push_back(logs);
      for (auto& cb : callbacks_) cb->on_epoch_end(*this, logs);
      write_backup(it.get(), true, result);
    }
    // The run's last epoch: the configured one, or a callback's stop (early stopping).
    const bool last = state_.epoch + 1 >= epochs || budget_spent() || (stop_ && !result.preempted);
    if (!options.checkpoint_dir.empty() && is_chief() &&
        (!epoch_done || last || (state_.epoch + 1) % options.checkpoint_every == 0)) {
      result.last_checkpoint = save_checkpoint(options.checkpoint_dir, *model_, *optimizer_,
                                               state_to_save(it.get(), epoch_done));
    }
    if (!epoch_done) break;  // stopped mid-epoch
    state_.step_in_epoch = 0;
  }
  result.seconds = since(t_fit);
  // Finished (all epochs, or a callback's decision): the backup has served its purpose. Only the
  // backups go, by name; the directory too when that empties it and hpm made it (this run, or
  // the one whose backup this run continued).
  if (!result.preempted && !options.backup_dir.empty() && !options.keep_backup && is_chief()) {
    remove_checkpoints(options.backup_dir);
    backup_lock = DirectoryLock();
    std::error_code ec;
    if (backup_dir_ours && std::filesystem::is_empty(options.backup_dir, ec) && !ec) {
      std::filesystem::remove(options.backup_dir, ec);
    }
  }
  for (auto& cb : callbacks_) cb->on_train_end(*this, result);
  return result;
}

EvalResult Trainer::evaluate(const data::LabelledData& data, std::int64_t batch_size) {
  NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->eval();
  const nn::Classification labels_alone;
  const nn::Objective* own = objective_ ? objective_->evaluation() : nullptr;
  const nn::Objective& objective = own ? *own : labels_alone;
  std::optional<DeviceGuard> on;
  if (device_ != nullptr) on.emplace(*device_);
  EvalResult r;
  for (std::int64_t begin = 0; begin < data.size(); begin += batch_size) {
    const std::int64_t n = std::min(batch_size, data.size() - begin);
    nn::Batch b{data.inputs.narrow(begin, n), data.labels.narrow(begin, n)};
    if (device_ != nullptr) b = {b.inputs.to(*device_), b.targets.to(*device_)};
    r.metrics.merge(objective.compute(model_->forward(b.inputs), b).metrics);
    r.samples += n;
  }
  model_->train(was_training);
  if (r.samples > 0) {
    r.loss = r.metrics.mean("loss");
    for (const auto& e : r.metrics.entries())
      if (e.name == "accuracy" || e.name == "token_accuracy") r.accuracy = e.mean();
  }
  objective.derive(r.metrics);
  return r;
}

Tensor Trainer::predict(const Tensor& inputs, std::int64_t batch_size) {
  NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->eval();
  std::vector<Tensor> parts;
  std::int64_t classes = 0;
  std::optional<DeviceGuard> on;
  if (device_ != nullptr) on.emplace(*device_);
  for (std::int64_t begin = 0; begin < inputs.size(0); begin += batch_size) {
    const std::int64_t n = std::min(batch_size, inputs.size(0) - begin);
    const Tensor x = inputs.narrow(begin, n);
    parts.push_back(model_->forward(device_ ? x.to(*device_) : x));
    classes = parts.back().size(1);
  }
  model_->train(was_training);
  Tensor out = Tensor::empty({inputs.size(0), classes}, DType::F32, Device::cpu());
  std::int64_t row = 0;
  for (auto& p : parts) {
    out.narrow(row, p.size(0)).copy_(p);
    row += p.size(0);
  }
  return out;
}

}  // namespace hpm::train
