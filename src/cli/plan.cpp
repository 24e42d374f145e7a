#include "hpm/cli/plan.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/config/pipeline_plan.h"
#include "hpm/pipeline/projection.h"
#include "hpm/pipeline/strategy.h"

namespace hpm::cli {

namespace {

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// pipeline::project_schedules as a table: one row per K and M, one column per schedule.
void print_projection(const std::vector<pipeline::LayerCost>& layers, nlohmann::json* report) {
  double f = 0, b = 0, w = 0;
  for (const auto& l : layers) {
    f += l.forward_s;
    b += l.backward_s;
    w += l.weight_s;
  }
  std::printf(
      "\nprojection (the profiled model's time split evenly over K stages; messages free):\n");
  std::printf("%4s %5s | %-22s | %-22s | %-22s | %-22s\n", "K", "M", "gpipe: step, bubble",
              "1f1b: step, bubble", "interleaved v=2", "zb-h1");
  nlohmann::json rows = nlohmann::json::array();
  for (const pipeline::ProjectedSchedule& p : pipeline::project_schedules(f, b, w)) {
    if (rows.empty() || rows.back()["stages"] != p.stages ||
        rows.back()["micro_batches"] != p.micro_batches) {
      if (!rows.empty()) std::printf("\n");
      std::printf("%4d %5d |", p.stages, p.micro_batches);
      rows.push_back({{"stages", p.stages}, {"micro_batches", p.micro_batches}});
    }
    std::printf(" %8.2fx ideal, %5.1f%% |", p.step_over_ideal, 100 * p.bubble);
    rows.back()[pipeline::schedule_name(p.kind)] = {{"step_over_ideal", p.step_over_ideal},
                                                    {"bubble", p.bubble},
                                                    {"formula", p.formula_bubble}};
  }
  std::printf("\n");
  (*report)["projection"] = rows;
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanCommandOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "profile a config's model, cut it into pipeline stages and simulate the schedule");
  add_config_flags(cmd, o.config_path, o.overrides, "TOML run configuration ([pipeline] section)",
                   &o.report);
  cmd->add_option("--message-us", o.message_us,
                  "microseconds for an activation to reach the next stage (default 0)")
      ->check(non_negative_number());
  cmd->add_flag("--project", o.project, "also simulate K = 2 ... 64 stages");
  cmd->add_option("--threads", o.threads, "kernel threads per stage while profiling")
      ->check(CLI::Range(1, 1024));
  return cmd;
}

int run_plan(const PlanCommandOptions& o) {
  const Config cfg = load_config(o.config_path, o.overrides);
  const PipelineSection& p = cfg.pipeline;
  use_threads(o.threads > 0 ? o.threads : std::max(1, cfg.threads / p.stages));
  const PipelinePlan plan = plan_pipeline(cfg, o.message_us * 1e-6);
  std::printf(
      "hpm plan %s: %zu layers, %lld parameters; micro-batch %lld rows (batch %lld / M %d)\n",
      cfg.path.c_str(), plan.model->size(), static_cast<long long>(plan.model->num_parameters()),
      static_cast<long long>(plan.micro_batch_rows), static_cast<long long>(plan.batch_rows),
      p.micro_batches);
  std::printf("\npartition (%s) into %d chunk(s) on %d stage(s):\n%s", p.partition.c_str(),
              plan.schedule.chunks(), p.stages,
              pipeline::describe(plan.partition, plan.layers).c_str());
  const pipeline::Simulation& sim = plan.simulation;
  std::printf(
      "\nschedule %s, K = %d, M = %d%s\n", p.schedule.c_str(), p.stages, p.micro_batches,
      p.chunks_per_stage > 1 ? (", v = " + std::to_string(p.chunks_per_stage)).c_str() : "");
  std::printf("  predicted step      %.3f ms (one device, same micro-batches: %.3f ms; %.2fx)\n",
              sim.step_s * 1e3, plan.one_device_step_s * 1e3, plan.one_device_step_s / sim.step_s);
  std::printf("  predicted bubble    %.1f%% (formula %.1f%%)\n", 100 * sim.bubble,
              100 * pipeline::theoretical_bubble(plan.schedule));
  for (std::size_t d = 0; d < sim.busy_s.size(); ++d) {
    std::printf("  stage %zu: busy %.3f ms, peak memory %.2f MiB\n", d, sim.busy_s[d] * 1e3,
                mib(sim.peak_bytes[d]));
  }
  nlohmann::json report = pipeline_plan_report(cfg, plan);
  if (o.project) print_projection(plan.layers, &report);
  write_report(o.report, report);
  return 0;
}

nlohmann::json pipeline_report_json(const distribute::Strategy* strategy) {
  const pipeline::PipelineReport* r = strategy ? pipeline::pipeline_report(*strategy) : nullptr;
  if (r == nullptr) return nullptr;
  const pipeline::StepStats& st = r->last_step;
  return {{"boundaries", r->partition.boundaries},
          {"stage_time_s", r->partition.time_s},
          {"imbalance", r->partition.imbalance},
          {"last_step_s", st.wall_s},
          {"last_step_bubble", st.bubble},
          {"busy_s", st.busy_s},
          {"peak_bytes", st.peak_bytes}};
}

}  // namespace hpm::cli
