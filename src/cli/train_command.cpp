#include "hpm/cli/train_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "hpm/cli/options.h"
#include "hpm/comm/gloo.h"
#include "hpm/io/atomic_file.h"
#include "hpm/launch/supervisor.h"
#include "hpm/launch/worker.h"
#include "hpm/trace/trace.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/op_profile_window.h"
#include "hpm/train/restart_callbacks.h"

namespace hpm::cli {

CLI::App* add_train_command(CLI::App& app, TrainCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand("train", "train a model described by a TOML config");
  add_common(cmd, o.common);
  cmd->add_option("--resume", o.resume, "continue from a checkpoint directory");
  cmd->add_option("--rank", o.worker.rank,
                  "this worker's rank (multi_worker_mirrored; else from hpm launch or mpirun)")
      ->check(non_negative_number());
  cmd->add_option("--world-size", o.worker.world_size, "number of worker processes")
      ->check(positive_number());
  cmd->add_option(
      "--rendezvous", o.worker.rendezvous,
      "HOST:PORT of rank 0's store (rank 0 hosts it), or a directory all workers share");
  cmd->add_option("--hostname", o.worker.hostname,
                  "address this worker's collectives bind to (default 127.0.0.1)");
  cmd->add_option("--op-profile", o.op_profile,
                  "write the training steps' time by op (all steps but the first) to this file");
  return cmd;
}

int run_train(const TrainCommandOptions& o) {
  const Common& c = o.common;
  const std::string& resume = o.resume;
  const WorkerFlags& worker = o.worker;
  Config cfg = configure(c);
  // Several processes (hpm launch, mpirun) but a strategy of one process: each would train the
  // same copy and write the same files, without a word.
  if (!cfg.pipeline.present && cfg.strategy != "multi_worker_mirrored" && worker.rank < 0) {
    if (const auto env = comm::gloo_options_from_env(); env && env->world_size > 1) {
      refuse_setting(cfg, "strategy", "kind",
                     "= \"" + cfg.strategy + "\" runs in one process, but this is one of " +
                         std::to_string(env->world_size) +
                         " processes (hpm launch, mpirun): each would train its own identical "
                         "copy. Use kind = \"multi_worker_mirrored\" (or [pipeline] stages = " +
                         std::to_string(env->world_size) + "), or run one process");
    }
  }
  TrainingRun run = make_training_run(cfg, worker);
  const std::shared_ptr<distribute::Strategy>& strategy = run.strategy;
  train::Trainer& trainer = *run.trainer;
  // In a multi-worker job only worker 0 speaks (progress, report); the others report errors.
  const bool chief = run.chief;
  const data::LabelledData test = test_set(cfg);
  if (chief) add_loggers(trainer, cfg);
  // Early stopping runs on every worker, not only the chief: each sees the same metrics (losses
  // are all-reduced, replicas identical), so all stop after the same epoch; a chief stopping
  // alone would leave the others waiting in a collective.
  std::shared_ptr<train::EarlyStopping> early;
  if (cfg.early_stopping) {
    early = std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{
        cfg.early_stopping_monitor, cfg.early_stopping_mode, cfg.early_stopping_min_delta,
        cfg.early_stopping_patience, cfg.early_stopping_restore_best_weights});
    trainer.add_callback(early);
  }
  if (!cfg.best_checkpoint_dir.empty() && chief) {
    trainer.add_callback(std::make_shared<train::BestModelCheckpoint>(cfg.best_checkpoint_dir,
                                                                      cfg.best_checkpoint_monitor));
  }

  train::FitOptions& fo = run.fit;
  fo.resume_from = resume;
  fo.backup_dir = cfg.backup_dir;
  fo.backup_every_steps = cfg.backup_every_steps;
  fo.keep_backup = cfg.keep_backup;
  // SIGTERM/SIGINT finish the step and back up, when there is somewhere to back up to.
  if (!cfg.backup_dir.empty()) fo.stop_signal = launch::install_preemption_handlers();
  trainer.add_callback(std::make_shared<train::BackupRestoreReport>());
  if (auto fault = train::fault_injector_from_env(strategy ? strategy->worker_rank() : 0)) {
    trainer.add_callback(fault);
  }

  if (!o.op_profile.empty()) {
    io::output_file_target(o.op_profile);  // before training, not after it
    trainer.add_callback(std::make_shared<train::OpProfileWindow>(o.op_profile));
  }
  if (chief) print_banner(cfg, run, test.size());
  std::string timeline = cfg.timeline;
  if (!timeline.empty() && strategy && strategy->num_workers() > 1)
    timeline += ".rank" + std::to_string(strategy->worker_rank());
  if (!timeline.empty()) {
    io::output_file_target(timeline);  // before training, not after it
    trace::start();
  }
  train::FitResult r;
  if (cfg.device_budget_mb > 0 && !cfg.pipeline.present)  // [memory]: what training may hold
    trainer.device().set_budget(static_cast<std::size_t>(cfg.device_budget_mb * 1024.0 * 1024.0));
  try {
    r = trainer.fit(run.pipeline, &test, fo);
  } catch (const train::TrainingError& e) {
    std::string last;
    if (!cfg.checkpoint_dir.empty() && std::filesystem::exists(cfg.checkpoint_dir + "/latest")) {
      last = cfg.checkpoint_dir + "/" + io::read_file(cfg.checkpoint_dir + "/latest");
      while (!last.empty() && last.back() == '\n') last.pop_back();
    }
    std::fprintf(
        stderr, "hpm: error: %s; %s\n", e.what(),
        last.empty() ? "no checkpoint was written" : ("last good checkpoint: " + last).c_str());
    return dynamic_cast<const train::OutOfMemoryStop*>(&e) != nullptr ? launch::kExitOutOfMemory
                                                                      : 3;
  }
  if (!timeline.empty()) {
    trace::stop();
    const std::string& path = timeline;
    const bool svg = path.size() > 4 && path.compare(path.size() - 4, 4, ".svg") == 0;
    io::write_file_atomic(
        path,
        svg ? trace::svg(trace::events(), "hpm train " + cfg.path + " (" +
                                              (strategy ? strategy->name() : "one_device") + ")")
            : trace::chrome_json(trace::events()));
  }
  if (r.preempted) {
    if (chief) {
      std::fprintf(stderr,
                   "hpm: preempted after global step %lld; backup written to %s: run the same "
                   "command again to continue\n",
                   static_cast<long long>(trainer.state().global_step), cfg.backup_dir.c_str());
    }
    return launch::kExitPreempted;
  }
  if (!chief) return 0;
  if (r.steps == 0) {
    // Continued from a checkpoint or backup that already holds the whole run: say so, rather
    // than report a "finished" run that trained nothing.
    std::fprintf(stderr,
                 "hpm: nothing left to train: the run %s is at global step %lld, its end (raise "
                 "[train] %s to train further)\n",
                 !resume.empty() ? ("resumed from " + resume).c_str()
                                 : ("continued from " + r.restored_from).c_str(),
                 static_cast<long long>(trainer.state().global_step),
                 cfg.by_steps() ? "max_steps" : "epochs");
  }
  report_finished_run(cfg, run, r, test, early.get(), c.report);
  return 0;
}

}  // namespace hpm::cli
