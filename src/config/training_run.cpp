#include "hpm/config/training_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "hpm/config/datasets.h"
#include "hpm/distribute/ps/checkpoint.h"
#include "hpm/tensor/random.h"
#include "hpm/train/callbacks.h"
#include "hpm/train/checkpoint.h"
#include "hpm/train/tensorboard.h"

namespace hpm::config {

TrainingRun make_training_run(const Config& cfg, const WorkerFlags& worker,
                              comm::CommunicatorPtr* workers,
                              std::shared_ptr<const nn::Objective> objective) {
  manual_seed(cfg.seed);  // model initialization draws from the default generator
  TrainingRun run;
  run.strategy = build_strategy(cfg, worker, workers);
  std::shared_ptr<optim::LrSchedule> schedule = build_schedule(cfg);
  if (run.strategy) {
    // A pipeline cuts the Sequential itself and applies [memory] per stage.
    run.strategy->scope(
        [&] {
          return cfg.pipeline.present ? std::shared_ptr<nn::Module>(build_model(cfg))
                                      : with_memory_options(cfg, build_model(cfg));
        },
        [&](nn::Module& m) { return build_optimizer(cfg, m); });
    run.model = run.strategy->model();
    run.optimizer = run.strategy->optimizer();
    run.trainer = std::make_unique<train::Trainer>(run.strategy, schedule);
    run.chief = run.strategy->worker_rank() == 0;
  } else {
    run.model = with_memory_options(cfg, build_model(cfg));
    run.optimizer = build_optimizer(cfg, *run.model);
    run.trainer = std::make_unique<train::Trainer>(run.model, run.optimizer, schedule);
  }
  if (cfg.device != "cpu") {
    if (run.strategy) {
      refuse_setting(cfg, "train", "device",
                     "= \"" + cfg.device + "\" trains one replica on one GPU; [strategy] " +
                         run.strategy->name() + " and [pipeline] run on the CPU for now");
    }
    run.trainer->set_device(config_device(cfg));
  }
  // A classifier without one keeps the Trainer's own (Classification, fit options' smoothing).
  if (objective || cfg.model_kind == "gpt")
    run.trainer->set_objective(objective ? std::move(objective) : build_objective(cfg));
  run.pipeline = training_pipeline(cfg, &run.train_examples, run.strategy.get());
  run.fit = fit_options(cfg);
  run.fit.per_worker_input =
      run.strategy && run.strategy->num_workers() > 1 && cfg.shard != "batch";
  return run;
}

std::shared_ptr<nn::Module> load_trained_model(Config cfg, const std::string& checkpoint,
                                               const std::string& weights) {
  if (!weights.empty()) cfg.init_from = weights;
  std::shared_ptr<nn::Module> model = build_model(cfg);
  if (checkpoint.empty()) return model;
  if (const std::string ps = distribute::ps::ps_checkpoint_dir(checkpoint); !ps.empty()) {
    nn::NamedTensors held =
        distribute::ps::ps_checkpoint_weights(distribute::ps::read_ps_checkpoint(ps));
    for (const auto& [name, t] : model->state_dict()) {
      const bool saved = std::any_of(held.begin(), held.end(),
                                     [&, n = name](const auto& h) { return h.first == n; });
      if (!saved) held.emplace_back(name, t);
    }
    model->load_weights(held);
  } else {
    check_checkpoint_tokenizer(train::load_checkpoint(checkpoint, *model, nullptr), cfg,
                               "the checkpoint " + checkpoint);
  }
  return model;
}

void add_loggers(train::Trainer& trainer, const Config& cfg, const std::string& run,
                 bool progress) {
  if (progress) {
    trainer.add_callback(std::make_shared<train::ProgressCallback>(
        stdout, isatty(fileno(stdout)) != 0, progress_options(cfg)));
  }
  if (!cfg.metrics_csv.empty()) {
    const std::filesystem::path p(cfg.metrics_csv);
    trainer.add_callback(std::make_shared<train::CsvLogger>(
        run.empty() ? cfg.metrics_csv
                    : (p.parent_path() / (p.stem().string() + "-" + run + p.extension().string()))
                          .string()));
  }
  if (!cfg.tensorboard_dir.empty()) {
    trainer.add_callback(std::make_shared<train::TensorBoardLogger>(
        run.empty() ? cfg.tensorboard_dir : cfg.tensorboard_dir + "/" + run, cfg.by_steps()));
  }
}

}  // namespace hpm::config
