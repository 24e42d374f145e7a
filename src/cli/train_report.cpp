// What hpm train prints and reports around the training.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hpm/cli/plan.h"
#include "hpm/cli/report.h"
#include "hpm/cli/train_command.h"
#include "hpm/train/callbacks.h"

namespace hpm::cli {

void print_banner(const Config& cfg, const TrainingRun& run, std::int64_t test_examples) {
  const std::shared_ptr<distribute::Strategy>& strategy = run.strategy;
  std::printf("hpm train %s: %lld parameters, ", cfg.path.c_str(),
              static_cast<long long>(run.model->num_parameters()));
  if (cfg.token_source()) {  // windows drawn by step: the run's length is its steps
    std::printf("%lld steps", static_cast<long long>(cfg.max_steps));
  } else {
    if (cfg.by_steps()) std::printf("%lld steps over ", static_cast<long long>(cfg.max_steps));
    std::printf("%lld training", static_cast<long long>(run.train_examples));
  }
  std::printf(" / %lld %s examples, batch %lld, %d thread(s)",
              static_cast<long long>(test_examples), cfg.token_source() ? "validation" : "test",
              static_cast<long long>(cfg.batch_size), cfg.threads);
  if (cfg.device != "cpu") std::printf(", on %s", run.trainer->device().id().str().c_str());
  if (cfg.pipeline.present) {
    // One model, cut: replicas would say nothing here; the cut and the schedule do.
    std::printf(", pipeline: %d stages (%s), %d micro-batches, schedule %s", cfg.pipeline.stages,
                strategy && strategy->num_workers() > 1 ? "processes" : "threads",
                cfg.pipeline.micro_batches, cfg.pipeline.schedule.c_str());
  } else if (strategy) {
    std::printf(", strategy %s: %d replica(s) in sync (%d worker(s) x %d)",
                strategy->name().c_str(), strategy->num_replicas_in_sync(), strategy->num_workers(),
                strategy->local_replicas());
  }
  std::printf("\n");
}

void report_finished_run(const Config& cfg, const TrainingRun& run, const train::FitResult& r,
                         const data::LabelledData& test, const train::EarlyStopping* early,
                         const std::string& report) {
  const std::shared_ptr<distribute::Strategy>& strategy = run.strategy;
  train::Trainer& trainer = *run.trainer;
  if (early && early->stopped_epoch() >= 0) {
    std::printf("early stopping after epoch %lld: best %s %.4f at epoch %lld%s\n",
                static_cast<long long>(early->stopped_epoch() + 1),
                cfg.early_stopping_monitor.c_str(), early->best(),
                static_cast<long long>(early->best_epoch() + 1),
                cfg.early_stopping_restore_best_weights ? " (its weights restored)" : "");
  }
  // The weights evaluated below are the best epoch's, restored in memory; the last checkpoint
  // holds the last epoch's (hpm evaluate on it gave other figures than these, without a word).
  // Epochs counted from the run's start (a continued run's history holds only its own).
  const std::int64_t last_epoch = r.history.empty() ? 0 : r.history.back().epoch + 1;
  const bool restored_best = early && early->best_epoch() >= 0 &&
                             cfg.early_stopping_restore_best_weights &&
                             early->best_epoch() + 1 < last_epoch;
  if (restored_best && !r.last_checkpoint.empty()) {
    std::printf(
        "the figures below are epoch %lld's (restored); %s holds the last epoch's weights%s\n",
        static_cast<long long>(early->best_epoch() + 1), r.last_checkpoint.c_str(),
        cfg.best_checkpoint_dir.empty() ? " (best_checkpoint_dir keeps the best epoch's)" : "");
  }
  const train::EvalResult ev = trainer.evaluate(test);
  const bool text = cfg.token_source();
  // A language model's figures are per token, on the validation split.
  const double tokens_per_s =
      text ? r.samples_per_s() * static_cast<double>(cfg.gpt.block_size) : 0;
  if (text) {
    std::printf(
        "val loss %.4f, val perplexity %.2f, val token accuracy %.4f, %.0f training tokens/s, %.1f "
        "s\n",
        ev.loss, std::exp(ev.loss), ev.accuracy, tokens_per_s, r.seconds);
  } else {
    std::printf("test accuracy %.4f, test loss %.4f, %.0f training samples/s, %.1f s\n",
                ev.accuracy, ev.loss, r.samples_per_s(), r.seconds);
  }
  if (const nlohmann::json pj = pipeline_report_json(strategy.get()); !pj.is_null()) {
    std::printf("pipeline: cut at %s (imbalance %.2f); last step %.1f ms, bubble %.1f%%\n",
                pj["boundaries"].dump().c_str(), pj["imbalance"].get<double>(),
                1e3 * pj["last_step_s"].get<double>(), 100 * pj["last_step_bubble"].get<double>());
  }
  nlohmann::json history = nlohmann::json::array();
  for (const auto& e : r.history) {
    nlohmann::json metrics = nlohmann::json::object();  // whatever the objective names
    for (const auto& m : e.train_metrics.entries()) metrics[m.name] = m.mean();
    history.push_back({{"epoch", e.epoch + 1},
                       {"train_loss", e.train_loss},
                       {"train_accuracy", e.train_accuracy},
                       {"train_metrics", metrics},
                       {"test_loss", e.test_loss},
                       {"test_accuracy", e.test_accuracy},
                       {"samples_per_s", e.samples_per_s},
                       {"input_bound", e.input_bound},
                       {"lr", e.lr}});
  }
  write_report(report,
               {{"test_accuracy", ev.accuracy},
                {"test_loss", ev.loss},
                {"train_samples_per_s", r.samples_per_s()},
                {"train_samples_per_s_after_first_step", r.samples_per_s_after_first()},
                {"epochs", trainer.state().epoch},
                {"steps", trainer.state().global_step},
                {"steps_this_run", r.steps},
                {"seconds", r.seconds},
                {"train_seconds", r.train_seconds},
                {"step_peak_bytes", r.step_peak_bytes},
                {"device_peak_bytes", r.device_peak_bytes},
                {"device", trainer.device().id().str()},
                {"input_wait_seconds", r.input_wait_seconds},
                {"threads", cfg.threads},
                {"strategy", strategy ? strategy->name() : std::string("one_device")},
                {"replicas_in_sync", strategy ? strategy->num_replicas_in_sync() : 1},
                {"gradient_wait_seconds", strategy ? strategy->gradient_wait_seconds() : 0.0},
                {"batch_size", cfg.batch_size},
                {"parameters", run.model->num_parameters()},
                {"checkpoint", r.last_checkpoint},
                // Whose weights the test figures are: the best epoch's when early stopping
                // restored them (1-based), the last epoch's otherwise.
                {"evaluated_epoch", restored_best ? early->best_epoch() + 1 : last_epoch},
                {"restored_from", r.restored_from},
                {"backups", r.backups},
                {"backup_seconds", r.backup_seconds},
                {"backup_bytes", r.backup_bytes},
                {"pipeline", pipeline_report_json(strategy.get())},
                {"early_stopped_epoch", early && early->stopped_epoch() >= 0
                                            ? nlohmann::json(early->stopped_epoch() + 1)
                                            : nlohmann::json()},
                {"history", history},
                {"train_tokens_per_s", text ? nlohmann::json(tokens_per_s) : nlohmann::json()},
                {"train_tokens_per_s_after_first_step",
                 text ? nlohmann::json(r.samples_per_s_after_first() *
                                       static_cast<double>(cfg.gpt.block_size))
                      : nlohmann::json()},
                {"val_loss", text ? nlohmann::json(ev.loss) : nlohmann::json()},
                {"val_perplexity", text ? nlohmann::json(std::exp(ev.loss)) : nlohmann::json()}});
}

}  // namespace hpm::cli
