#include "hpm/train/callbacks.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "hpm/autograd/grad_mode.h"
#include "hpm/io/atomic_file.h"
#include "hpm/tensor/random.h"

namespace hpm::train {

namespace {
std::string eta(double seconds) {
  char buf[32];
  const int s = static_cast<int>(seconds + 0.5);
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}
}  // namespace

ProgressCallback::ProgressCallback(std::FILE* out, bool tty, std::int64_t epochs,
                                   std::int64_t every)
    : ProgressCallback(out, tty, ProgressOptions{epochs, every, 0, 0}) {}

ProgressCallback::ProgressCallback(std::FILE* out, bool tty, const ProgressOptions& options)
    : out_(out), tty_(tty), options_(options) {}

void ProgressCallback::on_epoch_begin(Trainer&, std::int64_t) {
  epoch_start_ = std::chrono::steady_clock::now();
  last_draw_ = {};
  steps_this_epoch_ = 0;
}

std::string ProgressCallback::rate(double samples_per_s) const {
  char buf[48];
  if (options_.tokens_per_sample > 0) {
    std::snprintf(buf, sizeof buf, "%.0f tokens/s",
                  samples_per_s * static_cast<double>(options_.tokens_per_sample));
  } else {
    std::snprintf(buf, sizeof buf, "%.0f samples/s", samples_per_s);
  }
  return buf;
}

namespace {

// Logs made by hand (tests, other loops) may carry no metrics: loss and accuracy as before.
nn::Metrics classification_metrics(double loss, double accuracy) {
  nn::Metrics m;
  m.add("loss", loss, 1.0);
  m.add("accuracy", accuracy, 1.0);
  return m;
}

std::string shown(const BatchLogs& b) {
  return metrics_text(b.running_metrics.entries().empty()
                          ? classification_metrics(b.running_loss, b.running_accuracy)
                          : b.running_metrics);
}

}  // namespace

// By steps: one count over the run, the rate in the run's unit, ETA to its last step.
void ProgressCallback::step_line(const BatchLogs& b, std::chrono::steady_clock::time_point now) {
  const std::int64_t total = options_.total_steps;
  const double per_step = std::chrono::duration<double>(now - epoch_start_).count() /
                          static_cast<double>(std::max<std::int64_t>(1, steps_this_epoch_));
  const std::string remaining =
      eta(per_step * static_cast<double>(std::max<std::int64_t>(0, total - b.global_step)));
  const auto step = static_cast<long long>(b.global_step);
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && b.global_step != total) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const auto filled =
        static_cast<int>(kWidth * std::min<std::int64_t>(b.global_step, total) / total);
    std::fprintf(out_, "\r\033[Kstep %lld/%lld [%s%s] %s %s ETA %s", step,
                 static_cast<long long>(total),
                 std::string(static_cast<std::size_t>(filled), '=').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(),
                 shown(b).c_str(), rate(b.samples_per_s).c_str(), remaining.c_str());
  } else if (options_.every > 0 && b.global_step % options_.every == 0) {
    std::fprintf(out_, "step %lld/%lld %s %s eta %s\n", step, static_cast<long long>(total),
                 shown(b).c_str(), rate(b.samples_per_s).c_str(), remaining.c_str());
  } else {
    return;
  }
  std::fflush(out_);
}

void ProgressCallback::on_batch_end(Trainer&, const BatchLogs& b) {
  const auto now = std::chrono::steady_clock::now();
  ++steps_this_epoch_;
  if (options_.total_steps > 0) {
    step_line(b, now);
    return;
  }
  const std::int64_t epochs = options_.epochs, every = options_.every;
  const bool known = b.steps_per_epoch > 0;  // pipelines of unknown length show no bar or ETA
  const double remaining = known && b.samples_per_s > 0
                               ? static_cast<double>(b.steps_per_epoch - b.step_in_epoch) *
                                     (std::chrono::duration<double>(now - epoch_start_).count() /
                                      static_cast<double>(b.step_in_epoch))
                               : 0.0;
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100) && b.step_in_epoch != b.steps_per_epoch)
      return;
    last_draw_ = now;
    if (!known) {
      std::fprintf(out_, "\r\033[Kepoch %lld/%lld step %lld %s %.0f samples/s",
                   static_cast<long long>(b.epoch + 1), static_cast<long long>(epochs),
                   static_cast<long long>(b.step_in_epoch), shown(b).c_str(), b.samples_per_s);
      std::fflush(out_);
      return;
    }
    constexpr int kWidth = 30;
    const auto filled = static_cast<int>(kWidth * b.step_in_epoch / b.steps_per_epoch);
    std::fprintf(out_, "\r\033[Kepoch %lld/%lld [%s%s] %lld/%lld %s %.0f samples/s ETA %s",
                 static_cast<long long>(b.epoch + 1), static_cast<long long>(epochs),
                 std::string(static_cast<std::size_t>(filled), '=').c_str(),
                 std::string(static_cast<std::size_t>(kWidth - filled), ' ').c_str(),
                 static_cast<long long>(b.step_in_epoch), static_cast<long long>(b.steps_per_epoch),
                 shown(b).c_str(), b.samples_per_s, eta(remaining).c_str());
    std::fflush(out_);
  } else if (every > 0 && b.step_in_epoch % every == 0) {
    if (known) {
      std::fprintf(out_, "epoch %lld step %lld/%lld %s samples/s %.0f eta %s\n",
                   static_cast<long long>(b.epoch + 1), static_cast<long long>(b.step_in_epoch),
                   static_cast<long long>(b.steps_per_epoch), shown(b).c_str(), b.samples_per_s,
                   eta(remaining).c_str());
    } else {  // a pipeline of unknown length: no total, no ETA
      std::fprintf(out_, "epoch %lld step %lld %s samples/s %.0f\n",
                   static_cast<long long>(b.epoch + 1), static_cast<long long>(b.step_in_epoch),
                   shown(b).c_str(), b.samples_per_s);
    }
    std::fflush(out_);
  }
}

// By steps, at each evaluation: "step 1250/2000: train loss ..., val loss ..., 56789 tokens/s".
void ProgressCallback::step_summary(const EpochLogs& e) {
  std::fprintf(out_, "step %lld/%lld: train %s", static_cast<long long>(e.global_step),
               static_cast<long long>(options_.total_steps),
               metrics_text(e.train_metrics.entries().empty()
                                ? classification_metrics(e.train_loss, e.train_accuracy)
                                : e.train_metrics)
                   .c_str());
  if (e.test_accuracy >= 0) {
    std::fprintf(out_, ", val %s",
                 metrics_text(e.test_metrics.entries().empty()
                                  ? classification_metrics(e.test_loss, e.test_accuracy)
                                  : e.test_metrics)
                     .c_str());
  }
  std::fprintf(out_, ", %s, %.1fs, input-bound %.1f%%\n", rate(e.samples_per_s).c_str(), e.seconds,
               100.0 * e.input_bound);
  std::fflush(out_);
}

void ProgressCallback::on_epoch_end(Trainer&, const EpochLogs& e) {
  if (tty_) std::fprintf(out_, "\n");
  if (options_.total_steps > 0) {
    step_summary(e);
    return;
  }
  const std::string train =
      e.train_metrics.entries().empty()
          ? metrics_text(classification_metrics(e.train_loss, e.train_accuracy))
          : metrics_text(e.train_metrics);
  std::fprintf(out_, "epoch %lld/%lld: %s", static_cast<long long>(e.epoch + 1),
               static_cast<long long>(options_.epochs), train.c_str());
  if (e.test_accuracy >= 0) {
    std::fprintf(out_, " test_loss %.4f test_acc %.4f", e.test_loss, e.test_accuracy);
  }
  std::fprintf(out_, " %.0f samples/s %.1fs input-bound %.1f%%\n", e.samples_per_s, e.seconds,
               100.0 * e.input_bound);
  std::fflush(out_);
}

CsvLogger::CsvLogger(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw io::IoError("cannot create metrics log " + path + ": " + std::strerror(errno));
}

void CsvLogger::on_train_begin(Trainer& t) {
  out_.close();
  extra_.clear();
  header_written_ = false;
  std::string kept;
  if (t.state().global_step > 0) {
    // The header and the rows of epochs 1..state.epoch (the ones finished before the restore).
    std::istringstream lines(io::read_file(path_));
    std::string line;
    bool header = true;
    while (std::getline(lines, line)) {
      if (header) {
        if (line.rfind("epoch,", 0) != 0) break;  // not this logger's file: start anew
        std::istringstream cols(line);
        std::string col;
        for (int i = 0; std::getline(cols, col, ','); ++i)
          if (i >= 8) extra_.push_back(col.substr(6));  // "train_<metric>"
        header_written_ = true;
        header = false;
      } else {
        std::int64_t epoch = 0;
        try {
          epoch = std::stoll(line.substr(0, line.find(',')));
        } catch (const std::exception&) {
          continue;
        }
        if (epoch > t.state().epoch) break;
      }
      kept += line + '\n';
    }
    if (!header_written_) extra_.clear();
  }
  io::write_file_atomic(path_, kept);
  out_.open(path_, std::ios::app);
  if (!out_) throw io::IoError("cannot write metrics log " + path_ + ": " + std::strerror(errno));
}

void CsvLogger::on_epoch_end(Trainer&, const EpochLogs& e) {
  if (!header_written_) {
    // The fixed columns, then one per metric the objective adds ("train_token_accuracy", ...).
    out_ << "epoch,train_loss,train_accuracy,test_loss,test_accuracy,lr,samples_per_s,seconds";
    for (const auto& m : e.train_metrics.entries()) {
      if (m.name == "loss" || m.name == "accuracy") continue;
      out_ << ",train_" << m.name;
      extra_.push_back(m.name);
    }
    out_ << '\n';
    header_written_ = true;
  }
  // An objective without a per-row accuracy (a language model's) leaves its cell empty.
  const bool has_accuracy = e.train_metrics.entries().empty() || e.train_metrics.has("accuracy");
  out_ << e.epoch + 1 << ',' << e.train_loss << ',';
  if (has_accuracy) out_ << e.train_accuracy;
  out_ << ',';
  if (e.test_accuracy >= 0)
    out_ << e.test_loss << ',' << e.test_accuracy;
  else
    out_ << ',';
  out_ << ',' << e.lr << ',' << e.samples_per_s << ',' << e.seconds;
  for (const auto& name : extra_) out_ << ',' << e.train_metrics.mean(name);
  out_ << '\n';
  out_.flush();
  if (!out_) throw io::IoError("cannot write metrics log " + path_ + ": " + std::strerror(errno));
}

// ---- Watching one epoch metric ---------------------------------------------------------------

namespace {
std::string known_monitors() {
  std::string s;
  for (const char* m : kMonitors) s += (s.empty() ? "" : ", ") + std::string(m);
  return s;
}

// Strictly better by more than min_delta (Keras: a tie is not an improvement).
bool improves(const std::string& mode, double value, double best, double min_delta) {
  return mode == "min" ? value < best - min_delta : value > best + min_delta;
}

double worst(const std::string& mode) {
  return mode == "min" ? std::numeric_limits<double>::infinity()
                       : -std::numeric_limits<double>::infinity();
}
}  // namespace

bool is_monitor(const std::string& monitor) {
  for (const char* m : kMonitors)
    if (monitor == m) return true;
  return false;
}

std::string resolve_mode(const std::string& monitor, const std::string& mode) {
  if (!is_monitor(monitor)) {
    throw std::invalid_argument("unknown monitor '" + monitor + "' (known: " + known_monitors() +
                                ")");
  }
  if (mode == "min" || mode == "max") return mode;
  if (mode != "auto") {
    throw std::invalid_argument("mode must be \"min\", \"max\" or \"auto\", got \"" + mode + "\"");
  }
  return monitor.ends_with("accuracy") ? "max" : "min";
}

double monitored_value(const EpochLogs& logs, const std::string& monitor) {
  if (monitor == "train_loss") return logs.train_loss;
  if (monitor == "train_accuracy") return logs.train_accuracy;
  if (monitor != "test_loss" && monitor != "test_accuracy") {
    throw std::invalid_argument("unknown monitor '" + monitor + "' (known: " + known_monitors() +
                                ")");
  }
  const double v = monitor == "test_loss" ? logs.test_loss : logs.test_accuracy;
  if (v < 0) {
    throw std::invalid_argument("monitor '" + monitor +
                                "' is not available: fit was given no evaluation data");
  }
  return v;
}

// ---- EarlyStopping ---------------------------------------------------------------------------

EarlyStopping::EarlyStopping(EarlyStoppingOptions options)
    : options_(std::move(options)), mode_(resolve_mode(options_.monitor, options_.mode)) {
  if (options_.patience < 0) throw std::invalid_argument("EarlyStopping: patience must be >= 0");
  if (!(options_.min_delta >= 0)) {
    throw std::invalid_argument("EarlyStopping: min_delta must be >= 0");
  }
}

void EarlyStopping::on_train_begin(Trainer&) {
  // A second fit starts afresh, as in Keras.
  best_ = worst(mode_);
  best_epoch_ = stopped_epoch_ = -1;
  wait_ = 0;
  best_weights_.clear();
}

void EarlyStopping::on_epoch_end(Trainer& trainer, const EpochLogs& e) {
  const double value = monitored_value(e, options_.monitor);
  if (improves(mode_, value, best_, options_.min_delta)) {
    best_ = value;
    best_epoch_ = e.epoch;
    wait_ = 0;
    if (options_.restore_best_weights) {
      NoGradGuard no_grad;
      best_weights_.clear();
      for (const auto& [name, t] : trainer.model().state_dict()) {
        best_weights_.emplace_back(name, t.clone());
      }
    }
    return;
  }
  if (++wait_ >= options_.patience) {
    stopped_epoch_ = e.epoch;
    trainer.stop_training();
  }
}

namespace {
constexpr const char* kEsBest = "early_stopping best";
constexpr const char* kEsBestEpoch = "early_stopping best_epoch";
constexpr const char* kEsWait = "early_stopping wait";
const std::string kEsWeights = "early_stopping best_weights/";
}  // namespace

void EarlyStopping::save_state(std::map<std::string, std::string>& metadata,
                               nn::NamedTensors& tensors) const {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", best_);  // read back to the same double
  metadata[kEsBest] = text;
  metadata[kEsBestEpoch] = std::to_string(best_epoch_);
  metadata[kEsWait] = std::to_string(wait_);
  for (const auto& [name, t] : best_weights_) tensors.emplace_back(kEsWeights + name, t);
}

void EarlyStopping::restore_state(const std::map<std::string, std::string>& metadata,
                                  const nn::NamedTensors& tensors) {
  const auto best = metadata.find(kEsBest), epoch = metadata.find(kEsBestEpoch),
             wait = metadata.find(kEsWait);
  if (best == metadata.end() || epoch == metadata.end() || wait == metadata.end()) return;
  best_ = std::stod(best->second);
  best_epoch_ = std::stoll(epoch->second);
  wait_ = std::stoll(wait->second);
  best_weights_.clear();
  for (const auto& [name, t] : tensors) {
    if (name.rfind(kEsWeights, 0) == 0)
      best_weights_.emplace_back(name.substr(kEsWeights.size()), t);
  }
}

void EarlyStopping::on_train_end(Trainer& trainer, const FitResult&) {
  if (!options_.restore_best_weights || best_weights_.empty()) return;
  NoGradGuard no_grad;
  trainer.model().load_state_dict(best_weights_);
}

// ---- BestModelCheckpoint ---------------------------------------------------------------------

BestModelCheckpoint::BestModelCheckpoint(std::string dir, std::string monitor,
                                         const std::string& mode)
    : dir_(std::move(dir)), monitor_(std::move(monitor)), mode_(resolve_mode(monitor_, mode)) {
  if (dir_.empty()) throw std::invalid_argument("BestModelCheckpoint: dir is empty");
}

namespace {
constexpr const char* kBestMonitor = "best_monitor";
constexpr const char* kBestValue = "best_value";
}  // namespace

void BestModelCheckpoint::on_train_begin(Trainer& trainer) {
  io::ensure_directory(dir_);  // fail before any work if it cannot be written
  lock_ = DirectoryLock();     // this callback's from a fit that threw: released before it is taken
  lock_ = DirectoryLock(dir_, "best_checkpoint_dir");
  best_ = worst(mode_);
  best_epoch_ = -1;
  last_saved_.clear();
  if (!holds_checkpoints(dir_)) return;
  // The best so far, which a continued run must beat: starting from the worst would replace it
  // (one checkpoint kept) with the first epoch after a restart, however worse. A fresh run does
  // not replace an earlier run's best, as it does not overwrite its checkpoints.
  std::string why;
  TrainerState saved;
  try {
    saved = read_checkpoint_state(dir_);
    const auto monitor = saved.metadata.find(kBestMonitor);
    const auto value = saved.metadata.find(kBestValue);
    if (monitor == saved.metadata.end() || value == saved.metadata.end()) {
      why = "records no best value";
    } else if (monitor->second != monitor_) {
      why = "is the best by " + monitor->second + ", not " + monitor_;
    } else if (trainer.state().global_step == 0) {
      why = "is an earlier run's best";
    } else {
      best_ = std::stod(value->second);
      best_epoch_ = saved.epoch - 1;
      last_saved_ = resolve_checkpoint_dir(dir_);
      return;
    }
  } catch (const std::exception& e) {
    why = std::string("cannot be read (") + e.what() + ")";
  }
  throw InputError("best_checkpoint_dir " + dir_ + " holds a checkpoint that " + why +
                   ": hpm would replace it; move it away, or choose another directory");
}

void BestModelCheckpoint::on_epoch_end(Trainer& trainer, const EpochLogs& e) {
  const double value = monitored_value(e, monitor_);
  if (!improves(mode_, value, best_, 0.0)) return;
  best_ = value;
  best_epoch_ = e.epoch;
  // As the trainer's epoch-end checkpoints: resuming from it starts the next epoch afresh.
  TrainerState s = trainer.state();
  s.epoch = e.epoch + 1;
  s.step_in_epoch = 0;
  s.iterator_state.clear();
  s.rng = default_generator().state();
  s.metadata[kBestMonitor] = monitor_;
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);  // read back to the same double
  s.metadata[kBestValue] = text;
  last_saved_ = save_checkpoint(dir_, trainer.model(), trainer.optimizer(), s, /*keep=*/1);
}

void BestModelCheckpoint::on_train_end(Trainer&, const FitResult&) { lock_ = DirectoryLock(); }

}  // namespace hpm::train
