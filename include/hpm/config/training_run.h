// A training run of a configuration, assembled as `hpm train` runs it, for every command and
// program that trains from a Config (hpm train; hpm distill's teachers, student and baseline):
// the model from the config's seed, on one device or under its [strategy] or [pipeline], [memory]
// applied, the run's objective, its input pipeline and the fit options.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "hpm/comm/communicator.h"
#include "hpm/config/config.h"
#include "hpm/config/strategy.h"
#include "hpm/data/dataset.h"
#include "hpm/distribute/strategy.h"
#include "hpm/nn/module.h"
#include "hpm/nn/objective.h"
#include "hpm/optim/optimizer.h"
#include "hpm/train/trainer.h"

namespace hpm::config {

struct TrainingRun {
  std::shared_ptr<distribute::Strategy> strategy;  // null: one device
  std::shared_ptr<nn::Module> model;               // the strategy's primary copy, if any
  std::shared_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<train::Trainer> trainer;
  data::Dataset pipeline;  // training_pipeline: this worker's shard under a multi-worker job
  std::int64_t train_examples = 0;
  train::FitOptions fit;  // fit_options, and per-worker input under a multi-worker strategy
  bool chief = true;      // worker 0 of a multi-worker job, or the only one: it prints and writes
};

// Seeds the default generator with [train] seed, builds the strategy ([strategy], [pipeline];
// `worker` and `workers` as build_strategy takes them), the model ([memory] applied, but for a
// pipeline, which applies it per stage), its optimizer and schedule, the Trainer on [train] device
// (a strategy elsewhere than the CPU is a ConfigError), with `objective` (null: build_objective's).
TrainingRun make_training_run(const Config& cfg, const WorkerFlags& worker = {},
                              comm::CommunicatorPtr* workers = nullptr,
                              std::shared_ptr<const nn::Objective> objective = nullptr);

// The model `cfg` describes, holding trained weights from `checkpoint` (a Trainer's checkpoint,
// whose tokenizer must be cfg's; or a parameter-server job's, whose servers hold all but integer
// buffers, which keep their initial values) or from `weights` (a safetensors file, loaded as
// [model] init_from: every weight of the right shape unless init_strict = false). Give one.
std::shared_ptr<nn::Module> load_trained_model(Config cfg, const std::string& checkpoint,
                                               const std::string& weights = "");

// The loggers on `trainer`: progress on stdout (a bar on a terminal; unless `progress` is false),
// [train] metrics_csv and tensorboard_dir. `run` names a run beside the config's own ("teacher-0",
// "baseline", "copy-1"): its CSV beside the file ("runs/m.csv" -> "runs/m-baseline.csv"), its
// events in a folder of the TensorBoard directory, as TensorBoard lists runs; empty: the
// config's own.
void add_loggers(train::Trainer& trainer, const Config& cfg, const std::string& run = "",
                 bool progress = true);

}  // namespace hpm::config
