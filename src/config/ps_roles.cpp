#include "hpm/config/ps_roles.h"

#include <algorithm>
#include <chrono>

#include "hpm/config/datasets.h"
#include "hpm/config/ps.h"
#include "hpm/distribute/ps/worker.h"
#include "hpm/tensor/random.h"
#include "hpm/train/trainer.h"

namespace hpm::config {

namespace ps = distribute::ps;

namespace {

std::chrono::milliseconds seconds_as_ms(double s) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000));
}

// "0:12 1:3 4+:1": the steps of each staleness, the last bucket open-ended.
std::string staleness_text(const std::vector<std::int64_t>& histogram) {
  std::string out;
  for (std::size_t s = 0; s < histogram.size(); ++s) {
    if (histogram[s] == 0) continue;
    if (!out.empty()) out += ' ';
    out += std::to_string(s);
    if (s + 1 == histogram.size()) out += '+';
    out += ':';
    out += std::to_string(histogram[s]);
  }
  return out;
}

}  // namespace

void check_ps_settings(const Config& cfg) {
  if (!cfg.checkpoint_dir.empty()) {
    refuse_setting(cfg, "train", "checkpoint_dir",
                   "does not apply to hpm ps: the coordinator checkpoints every parameter-server "
                   "shard to [ps] checkpoint_dir");
  }
  const std::string no_files =
      "is not written by hpm ps: the coordinator prints each epoch, and its --report holds them";
  if (!cfg.tensorboard_dir.empty()) refuse_setting(cfg, "train", "tensorboard_dir", no_files);
  if (!cfg.metrics_csv.empty()) refuse_setting(cfg, "train", "metrics_csv", no_files);
  if (!cfg.backup_dir.empty()) {
    refuse_setting(cfg, "train", "backup_dir",
                   "does not apply to hpm ps: [ps] checkpoint_dir is what a lost task restores");
  }
  refuse_train_only_settings(cfg, "hpm ps");
  if (cfg.clip_grad_norm != 0.0f) {
    refuse_setting(cfg, "train", "clip_grad_norm",
                   "does not reach parameter-server workers: they push unclipped gradients");
  }
  // What the workers' input and the servers' optimizer do not honour, refused rather than run
  // otherwise than asked: each was ignored without a word.
  if (!cfg.augment.empty()) {
    refuse_setting(cfg, "data", "augment",
                   "is not applied by hpm ps's workers, which train on the IDX rows as stored (its "
                   "evaluation would see inputs its training did not)");
  }
  if (!cfg.shuffle || cfg.shuffle_buffer != -1) {
    refuse_setting(cfg, "data", cfg.shuffle ? "shuffle_buffer" : "shuffle",
                   "is not honoured by hpm ps: its workers take each epoch's rows in an order "
                   "shuffled whole");
  }
  if (!cfg.drop_remainder) {
    refuse_setting(cfg, "data", "drop_remainder",
                   "= false is not honoured by hpm ps: an epoch is its whole steps of "
                   "batch_size rows per worker part");
  }
  if (cfg.schedule_unit == "step") {
    refuse_setting(cfg, "schedule", "unit",
                   "= \"step\" is not honoured by hpm ps: its coordinator sets the learning rate "
                   "once an epoch");
  }
  if (cfg.by_steps()) {
    refuse_setting(cfg, "train", "max_steps",
                   "does not apply to hpm ps, which trains whole epochs ([train] epochs)");
  }
  if (cfg.weight_decay_min_rank != 0) {
    refuse_setting(cfg, "optimizer", "weight_decay_min_rank",
                   "does not reach the parameter servers' optimizer, which decays every variable");
  }
}

ps::ServerCounters run_ps_server(const Config& cfg, int task, const RunLog& log) {
  const ps::Cluster c = ps_cluster(cfg);
  ps::ParameterServer server(c, task, c.ps.at(static_cast<std::size_t>(task)));
  if (log) {
    log(format_line("hpm ps serve: parameter-server task %d listening on %s:%d%s", task,
                    c.bind.c_str(), server.port(), c.security.tls() ? " (TLS)" : ""));
  }
  server.wait();
  const ps::ServerCounters n = server.counters();
  if (log) {
    log(
        format_line("hpm ps serve: task %d done: %lld updates, %lld pushes, %lld duplicates, %lld "
                    "refused calls",
                    task, static_cast<long long>(n.version), static_cast<long long>(n.pushes),
                    static_cast<long long>(n.duplicates), static_cast<long long>(n.refused)));
  }
  return n;
}

ps::WorkerReport run_ps_worker(const Config& cfg, int task) {
  const ps::Cluster c = ps_cluster(cfg);
  manual_seed(cfg.seed);
  ps::WorkerOptions wo;
  wo.worker = task;
  wo.batch_size = cfg.batch_size;
  wo.seed = cfg.seed;
  wo.label_smoothing = cfg.label_smoothing;
  wo.precision = autograd::parse_precision(cfg.precision);
  wo.accumulation_steps = cfg.accumulation_steps;
  wo.slow_factor = cfg.ps.slow_worker == task ? cfg.ps.slow_factor : 1.0;
  wo.coordinator_timeout = seconds_as_ms(std::max(cfg.ps.ps_wait_s, cfg.ps.rpc_timeout_s));
  // [memory] wraps the worker's model as hpm train's (its variables keep the model's names).
  ps::Worker worker(c, with_memory_options(cfg, build_model(cfg)), ps_training_set(cfg), wo);
  return worker.run();
}

ps::CoordinatorReport run_ps_coordinator(const Config& cfg, const RunLog& log) {
  const ps::Cluster c = ps_cluster(cfg);
  const ps::Mode mode = ps::mode_from_name(cfg.ps.mode);
  manual_seed(cfg.seed);
  auto model = build_model(cfg);
  const std::int64_t n = ps_training_set(cfg).size();
  const data::LabelledData test = test_set(cfg);
  auto schedule = build_schedule(cfg);
  train::Trainer evaluator(model, build_optimizer(cfg, *model), schedule);

  ps::CoordinatorOptions co;
  co.mode = mode;
  co.staleness = cfg.ps.staleness;
  co.epochs = cfg.epochs;
  co.tasks_per_epoch =
      ps::tasks_per_epoch(n, cfg.batch_size, mode == ps::Mode::kSync ? c.workers : 1);
  co.optimizer = ps_optimizer(cfg);
  co.lr = [&](std::int64_t epoch) { return schedule->lr(cfg.lr, epoch); };
  co.checkpoint_dir = cfg.ps.checkpoint_dir;
  co.checkpoint_every_tasks = cfg.ps.checkpoint_every_tasks;
  co.metadata = checkpoint_description(cfg);  // evaluate and export need nothing else
  co.heartbeat_timeout = seconds_as_ms(cfg.ps.heartbeat_timeout_s);
  co.ps_wait = seconds_as_ms(cfg.ps.ps_wait_s);
  co.shutdown_servers = true;
  co.on_epoch = [&](ps::EpochReport& e) {
    const train::EvalResult ev = evaluator.evaluate(test);
    e.test_loss = ev.loss;
    e.test_accuracy = ev.accuracy;
    if (!log) return;
    log(format_line("epoch %lld/%lld: train loss %.4f acc %.4f, test loss %.4f acc %.4f, %.1f s",
                    static_cast<long long>(e.epoch + 1), static_cast<long long>(cfg.epochs),
                    e.train_loss, e.train_accuracy, e.test_loss, e.test_accuracy, e.seconds));
  };
  // Parameters and buffers: the evaluation (in eval mode) reads the running statistics too.
  ps::Coordinator coordinator(c, co, ps::ps_variables(*model), c.coordinator);
  if (log) {
    const std::string staleness =
        mode == ps::Mode::kSsp ? " (staleness " + std::to_string(cfg.ps.staleness) + ")" : "";
    log(format_line(
        "hpm ps coordinator %s: %lld parameters on %zu parameter-server task(s), %d "
        "worker(s), mode %s%s, %lld tasks of %lld rows per epoch",
        cfg.path.c_str(), static_cast<long long>(model->num_parameters()), c.ps.size(), c.workers,
        cfg.ps.mode.c_str(), staleness.c_str(), static_cast<long long>(co.tasks_per_epoch),
        static_cast<long long>(cfg.batch_size)));
  }
  const ps::CoordinatorReport r = coordinator.run();
  if (!log) return r;
  log(
      format_line("done: %lld tasks in %.1f s (%.1f tasks/s), %lld rescheduled, %lld failed and "
                  "rerun, %lld reported twice, %lld parameter-server restore(s), %lld "
                  "checkpoint(s)",
                  static_cast<long long>(r.tasks), r.seconds, r.tasks_per_s(),
                  static_cast<long long>(r.rescheduled), static_cast<long long>(r.failed),
                  static_cast<long long>(r.duplicate_done), static_cast<long long>(r.ps_restores),
                  static_cast<long long>(r.checkpoints)));
  for (const auto& w : r.workers) {
    log(format_line(
        "worker %d: %lld steps, %.1f steps/s, pull p50/p99 %.2f/%.2f ms, push "
        "p50/p99 %.2f/%.2f ms, staleness {%s}",
        w.worker, static_cast<long long>(w.steps), w.steps_per_s(), w.pull_ms_p50, w.pull_ms_p99,
        w.push_ms_p50, w.push_ms_p99, staleness_text(w.staleness_histogram).c_str()));
  }
  return r;
}

nlohmann::json ps_job_report(const Config& cfg, const ps::CoordinatorReport& r) {
  const ps::Cluster c = ps_cluster(cfg);
  nlohmann::json j{{"mode", cfg.ps.mode},
                   {"staleness", cfg.ps.staleness},
                   {"workers", c.workers},
                   {"ps_tasks", c.ps.size()},
                   {"tasks", r.tasks},
                   {"seconds", r.seconds},
                   {"tasks_per_s", r.tasks_per_s()},
                   {"rescheduled", r.rescheduled},
                   {"failed", r.failed},
                   {"duplicate_done", r.duplicate_done},
                   {"ps_restores", r.ps_restores},
                   {"checkpoints", r.checkpoints},
                   {"restored_from", r.restored_from}};
  j["epochs"] = nlohmann::json::array();
  for (const auto& e : r.epochs) {
    j["epochs"].push_back({{"epoch", e.epoch + 1},
                           {"seconds", e.seconds},
                           {"train_loss", e.train_loss},
                           {"train_accuracy", e.train_accuracy},
                           {"test_loss", e.test_loss},
                           {"test_accuracy", e.test_accuracy}});
  }
  j["per_worker"] = nlohmann::json::array();
  for (const auto& w : r.workers) {
    j["per_worker"].push_back({{"worker", w.worker},
                               {"steps", w.steps},
                               {"seconds", w.seconds},
                               {"steps_per_s", w.steps_per_s()},
                               {"pull_ms_p50", w.pull_ms_p50},
                               {"pull_ms_p99", w.pull_ms_p99},
                               {"push_ms_p50", w.push_ms_p50},
                               {"push_ms_p99", w.push_ms_p99},
                               {"failed_tasks", w.failed_tasks},
                               {"staleness_histogram", w.staleness_histogram}});
  }
  return j;
}

}  // namespace hpm::config
