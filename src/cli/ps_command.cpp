// `hpm ps ...`: the parameter-server job's processes (see ps_command.h), each one library call
// (config/ps_roles.h, distribute/ps/loopback_bench.h).
#include "hpm/cli/ps_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/config/ps.h"
#include "hpm/config/ps_roles.h"
#include "hpm/distribute/ps/loopback_bench.h"
#include "hpm/distribute/ps/worker.h"

namespace hpm::cli {

namespace ps = distribute::ps;

namespace {

// --task, else HPM_PS_INDEX (what `hpm launch --ps` sets), within the cluster's `count` tasks.
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

int run_worker(const Config& cfg, const PsCommandOptions& o) {
  const int w = task_index(o, ps_cluster(cfg).workers, "worker");
  try {
    const ps::WorkerReport r = run_ps_worker(cfg, w);
    std::printf("hpm ps worker %d: %lld steps, %.1f steps/s, pull p50 %.2f ms, push p50 %.2f ms\n",
                w, static_cast<long long>(r.steps), r.steps_per_s(), r.pull_ms_p50, r.push_ms_p50);
  } catch (const ps::PsError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return std::string(e.what()).find("not finite") != std::string::npos ? 3 : 1;
  }
  return 0;
}

int run_bench(const PsCommandOptions& o) {
  std::printf("%10s %12s %12s %12s %12s\n", "bytes", "pull ms", "pull GB/s", "push ms",
              "push GB/s");
  nlohmann::json results = nlohmann::json::array();
  for (const ps::PushPullTiming& t : ps::time_push_pull(parse_byte_sizes(o.sizes), o.repeats)) {
    const auto bytes = static_cast<double>(t.bytes);
    std::printf("%10lld %12.3f %12.2f %12.3f %12.2f\n", static_cast<long long>(t.bytes),
                t.pull_s_median * 1e3, bytes / t.pull_s_median / 1e9, t.push_s_median * 1e3,
                bytes / t.push_s_median / 1e9);
    results.push_back({{"bytes", t.bytes},
                       {"pull_s_median", t.pull_s_median},
                       {"push_s_median", t.push_s_median},
                       {"repeats", t.repeats}});
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
  check_ps_settings(cfg);
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
  if (role == "serve" || role == "ps") {
    run_ps_server(cfg,
                  task_index(o, static_cast<int>(ps_cluster(cfg).ps.size()), "parameter-server"));
    return 0;
  }
  if (role == "coordinator") {
    const ps::CoordinatorReport r = run_ps_coordinator(cfg);
    write_report(o.report, ps_job_report(cfg, r));
    return 0;
  }
  if (role == "worker") return run_worker(cfg, o);
  throw ConfigError("hpm ps run: HPM_PS_ROLE \"" + role +
                    "\" is not one of coordinator, ps, worker");
}

}  // namespace hpm::cli
