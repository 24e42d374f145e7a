// `hpm ps ...`: the parameter-server job's processes (see ps_command.h).
#include "hpm/cli/ps_command.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/config/ps.h"
#include "hpm/distribute/ps/coordinator.h"
#include "hpm/distribute/ps/server.h"
#include "hpm/distribute/ps/worker.h"
#include "hpm/io/atomic_file.h"
#include "hpm/tensor/device.h"
#include "hpm/train/trainer.h"

namespace hpm::cli {

namespace ps = distribute::ps;

namespace {

using Clock = std::chrono::steady_clock;

int task_index(const PsCommandOptions& o, int count, const char* what) {
  int task = o.task;
  if (task < 0) {
    if (const char* env = std::getenv("HPM_PS_INDEX")) task = std::atoi(env);
  }
  if (task < 0 || task >= count) {
    throw ConfigError(std::string("hpm ps: ") + what + " --task " + std::to_string(task) +
                      " is not in [0, " + std::to_string(count) + ") (the cluster's " + what +
                      " tasks)");
  }
  return task;
}

nlohmann::json worker_json(const ps::WorkerReport& w) {
  return {{"worker", w.worker},
          {"steps", w.steps},
          {"seconds", w.seconds},
          {"steps_per_s", w.steps_per_s()},
          {"pull_ms_p50", w.pull_ms_p50},
          {"pull_ms_p99", w.pull_ms_p99},
          {"push_ms_p50", w.push_ms_p50},
          {"push_ms_p99", w.push_ms_p99},
          {"failed_tasks", w.failed_tasks},
          {"staleness_histogram", w.staleness_histogram}};
}

int run_serve(const Config& cfg, const PsCommandOptions& o) {
  const ps::Cluster c = ps_cluster(cfg);
  const int task = task_index(o, static_cast<int>(c.ps.size()), "parameter-server");
  ps::ParameterServer server(c, task, c.ps[static_cast<std::size_t>(task)]);
  std::printf("hpm ps serve: parameter-server task %d listening on %s:%d%s\n", task, c.bind.c_str(),
              server.port(), c.security.tls() ? " (TLS)" : "");
  std::fflush(stdout);
  server.wait();
  const ps::ServerCounters n = server.counters();
  std::printf(
      "hpm ps serve: task %d done: %lld updates, %lld pushes, %lld duplicates, %lld "
      "refused calls\n",
      task, static_cast<long long>(n.version), static_cast<long long>(n.pushes),
      static_cast<long long>(n.duplicates), static_cast<long long>(n.refused));
  return 0;
}

int run_worker(const Config& cfg, const PsCommandOptions& o) {
  const ps::Cluster c = ps_cluster(cfg);
  const int w = task_index(o, c.workers, "worker");
  manual_seed(cfg.seed);
  ps::WorkerOptions wo;
  wo.worker = w;
  wo.batch_size = cfg.batch_size;
  wo.seed = cfg.seed;
  wo.label_smoothing = cfg.label_smoothing;
  wo.precision = autograd::parse_precision(cfg.precision);
  wo.accumulation_steps = cfg.accumulation_steps;
  wo.slow_factor = cfg.ps.slow_worker == w ? cfg.ps.slow_factor : 1.0;
  wo.coordinator_timeout = std::chrono::milliseconds(
      static_cast<std::int64_t>(std::max(cfg.ps.ps_wait_s, cfg.ps.rpc_timeout_s) * 1000));
  // [memory] wraps the worker's model as hpm train's (its variables keep the model's names).
  ps::Worker worker(c, with_memory_options(cfg, build_model(cfg)), ps_training_set(cfg), wo);
  try {
    const ps::WorkerReport r = worker.run();
    std::printf("hpm ps worker %d: %lld steps, %.1f steps/s, pull p50 %.2f ms, push p50 %.2f ms\n",
                w, static_cast<long long>(r.steps), r.steps_per_s(), r.pull_ms_p50, r.push_ms_p50);
  } catch (const ps::PsError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return std::string(e.what()).find("not finite") != std::string::npos ? 3 : 1;
  }
  return 0;
}

int run_coordinator(const Config& cfg, const PsCommandOptions& o) {
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
  co.heartbeat_timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(cfg.ps.heartbeat_timeout_s * 1000));
  co.ps_wait = std::chrono::milliseconds(static_cast<std::int64_t>(cfg.ps.ps_wait_s * 1000));
  co.shutdown_servers = true;
  co.on_epoch = [&](ps::EpochReport& e) {
    const train::EvalResult ev = evaluator.evaluate(test);
    e.test_loss = ev.loss;
    e.test_accuracy = ev.accuracy;
    std::printf("epoch %lld/%lld: train loss %.4f acc %.4f, test loss %.4f acc %.4f, %.1f s\n",
                static_cast<long long>(e.epoch + 1), static_cast<long long>(cfg.epochs),
                e.train_loss, e.train_accuracy, e.test_loss, e.test_accuracy, e.seconds);
    std::fflush(stdout);
  };
  // Parameters and buffers: the evaluation (in eval mode) reads the running statistics too.
  ps::Coordinator coordinator(c, co, ps::ps_variables(*model), c.coordinator);
  std::printf(
      "hpm ps coordinator %s: %lld parameters on %zu parameter-server task(s), %d worker(s), "
      "mode %s%s, %lld tasks of %lld rows per epoch\n",
      cfg.path.c_str(), static_cast<long long>(model->num_parameters()), c.ps.size(), c.workers,
      cfg.ps.mode.c_str(),
      mode == ps::Mode::kSsp ? (" (staleness " + std::to_string(cfg.ps.staleness) + ")").c_str()
                             : "",
      static_cast<long long>(co.tasks_per_epoch), static_cast<long long>(cfg.batch_size));
  std::fflush(stdout);
  const ps::CoordinatorReport r = coordinator.run();
  std::printf(
      "done: %lld tasks in %.1f s (%.1f tasks/s), %lld rescheduled, %lld failed and rerun, %lld "
      "reported twice, %lld parameter-server restore(s), %lld checkpoint(s)\n",
      static_cast<long long>(r.tasks), r.seconds, r.tasks_per_s(),
      static_cast<long long>(r.rescheduled), static_cast<long long>(r.failed),
      static_cast<long long>(r.duplicate_done), static_cast<long long>(r.ps_restores),
      static_cast<long long>(r.checkpoints));
  for (const auto& w : r.workers) {
    std::string hist;
    for (std::size_t s = 0; s < w.staleness_histogram.size(); ++s) {
      if (w.staleness_histogram[s] == 0) continue;
      hist += (hist.empty() ? "" : " ") + std::to_string(s) +
              (s + 1 == w.staleness_histogram.size() ? "+" : "") + ":" +
              std::to_string(w.staleness_histogram[s]);
    }
    std::printf(
        "worker %d: %lld steps, %.1f steps/s, pull p50/p99 %.2f/%.2f ms, push p50/p99 "
        "%.2f/%.2f ms, staleness {%s}\n",
        w.worker, static_cast<long long>(w.steps), w.steps_per_s(), w.pull_ms_p50, w.pull_ms_p99,
        w.push_ms_p50, w.push_ms_p99, hist.c_str());
  }
  if (!o.report.empty()) {
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
    for (const auto& w : r.workers) j["per_worker"].push_back(worker_json(w));
    write_report(o.report, j);
  }
  return 0;
}

// Push and pull of one variable of each size through one parameter-server task on loopback.
int run_bench(const PsCommandOptions& o) {
  ps::Cluster c;
  c.security.token = "bench";
  c.workers = 1;
  c.max_message_bytes = 1u << 30;
  ps::ParameterServer server(c, 0, "127.0.0.1:0");
  c.ps = {"127.0.0.1:" + std::to_string(server.port())};
  nlohmann::json results = nlohmann::json::array();
  std::printf("%10s %12s %12s %12s %12s\n", "bytes", "pull ms", "pull GB/s", "push ms",
              "push GB/s");
  std::size_t pos = 0;
  while (pos < o.sizes.size()) {
    std::size_t end = o.sizes.find(',', pos);
    if (end == std::string::npos) end = o.sizes.size();
    std::string s = o.sizes.substr(pos, end - pos);
    pos = end + 1;
    double mult = 1;
    if (!s.empty() && (s.back() == 'K' || s.back() == 'M' || s.back() == 'G')) {
      mult = s.back() == 'K' ? 1024.0 : s.back() == 'M' ? 1048576.0 : 1073741824.0;
      s.pop_back();
    }
    const auto bytes = static_cast<std::int64_t>(std::stod(s) * mult);
    Tensor v = Tensor::zeros({bytes / 4});
    v.set_requires_grad(true);
    nn::NamedTensors vars{{"v", v}};
    ps::PsClient client(c, {"v"}, {bytes / 4});
    client.init(vars, ps::OptimizerSpec{}, 0, {0});
    std::vector<double> pull, push;
    const std::vector<Tensor> grads{Tensor::full({bytes / 4}, 1e-3f)};
    for (int r = 0; r < o.repeats + 1; ++r) {  // the first of each is a warm-up
      auto t0 = Clock::now();
      const auto versions = client.pull(vars);
      auto t1 = Clock::now();
      client.push(grads, r, 0, versions, 0, 0, 0.01f);
      auto t2 = Clock::now();
      if (r == 0) continue;
      pull.push_back(std::chrono::duration<double>(t1 - t0).count());
      push.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    std::sort(pull.begin(), pull.end());
    std::sort(push.begin(), push.end());
    const double pm = pull[pull.size() / 2], sm = push[push.size() / 2];
    std::printf("%10lld %12.3f %12.2f %12.3f %12.2f\n", static_cast<long long>(bytes), pm * 1e3,
                static_cast<double>(bytes) / pm / 1e9, sm * 1e3,
                static_cast<double>(bytes) / sm / 1e9);
    results.push_back(
        {{"bytes", bytes}, {"pull_s_median", pm}, {"push_s_median", sm}, {"repeats", o.repeats}});
  }
  write_report(o.report, results);
  return 0;
}

}  // namespace

CLI::App* add_ps_command(CLI::App& app, PsCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand("ps", "parameter-server training: serve, coordinate, work");
  cmd->require_subcommand(1);
  auto add = [&](const char* role, const char* help, bool task) {
    CLI::App* sub = cmd->add_subcommand(role, help);
    add_config_flags(sub, o.config_path, o.overrides, "TOML run configuration ([cluster], [ps])");
    sub->add_option("--threads", o.threads, "intra-op threads")->check(CLI::Range(1, 1024));
    sub->add_option("--seed", o.seed, "random seed (overrides [train] seed)")->check(seed_range());
    if (task) sub->add_option("--task", o.task, "which task of the cluster (default HPM_PS_INDEX)");
    sub->callback([&o, role] { o.role = role; });
    return sub;
  };
  add("serve", "run parameter-server task --task I", true);
  add("coordinator", "run the coordinator (the chief)", false)
      ->add_option("--report", o.report, "write a JSON report to this file");
  add("worker", "run worker --task I", true);
  add("run", "run the role hpm launch --ps P --workers W gave (HPM_PS_ROLE, HPM_PS_INDEX)", false)
      ->add_option("--report", o.report, "coordinator: write a JSON report to this file");
  CLI::App* bench = cmd->add_subcommand("bench", "push and pull throughput over loopback");
  bench->add_option("--sizes", o.sizes, "comma-separated sizes (K, M, G suffixes)");
  bench->add_option("--repeats", o.repeats, "timed repeats per size (median reported)")
      ->check(CLI::Range(1, 1000));
  bench->add_option("--report", o.report, "write the results as JSON");
  bench->callback([&o] { o.role = "bench"; });
  return cmd;
}

int run_ps_command(const PsCommandOptions& o) {
  if (o.role == "bench") return run_bench(o);
  Config cfg = load_config(o.config_path, o.overrides);
  if (o.threads > 0) cfg.threads = o.threads;
  if (o.seed >= 0) cfg.seed = static_cast<std::uint64_t>(o.seed);
  // [train] settings of a Trainer run with no place in a parameter-server job.
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

  use_threads(cfg.threads);
  std::string role = o.role;
  if (role == "run") {
    const char* env = std::getenv("HPM_PS_ROLE");
    if (env == nullptr) {
      throw ConfigError(
          "hpm ps run: no HPM_PS_ROLE: start it under `hpm launch --ps P --workers W --`, or "
          "run `hpm ps serve|coordinator|worker` yourself");
    }
    role = env;
  }
  if (role == "serve" || role == "ps") return run_serve(cfg, o);
  if (role == "coordinator") return run_coordinator(cfg, o);
  if (role == "worker") return run_worker(cfg, o);
  throw ConfigError("hpm ps run: HPM_PS_ROLE \"" + role +
                    "\" is not one of coordinator, ps, worker");
}

}  // namespace hpm::cli
