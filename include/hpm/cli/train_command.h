// `hpm train CONFIG`: the run a configuration describes (config::make_training_run), with
// checkpoints, backups and preemption, progress and a report.
#pragma once
#include <string>

#include "hpm/cli/common_flags.h"
#include "hpm/config/strategy.h"
#include "hpm/config/training_run.h"

namespace CLI {
class App;
}

namespace hpm::cli {

struct TrainCommandOptions {
  Common common;
  std::string resume;      // --resume: a checkpoint directory to continue from
  WorkerFlags worker;      // --rank, --world-size, --rendezvous, --hostname
  std::string op_profile;  // --op-profile: the steps' time by op, a table written here
};

CLI::App* add_train_command(CLI::App& app, TrainCommandOptions& options);
// Exit codes: 0 done, 1 bad input (thrown), 3 a non-finite loss, kExitPreempted, kExitOutOfMemory.
int run_train(const TrainCommandOptions& options);

// What hpm train prints and reports around the training (train_report.cpp).
// "hpm train CONFIG: N parameters, ..., strategy ..." (the chief, before training).
void print_banner(const Config& cfg, const TrainingRun& run, std::int64_t test_examples);
// After training: early stopping, the evaluation on `test`, the pipeline's cut, and --report.
void report_finished_run(const Config& cfg, const TrainingRun& run, const train::FitResult& r,
                         const data::LabelledData& test, const train::EarlyStopping* early,
                         const std::string& report);

}  // namespace hpm::cli
