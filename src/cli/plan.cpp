#include "hpm/cli/plan.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "hpm/cli/options.h"
#include "hpm/cli/report.h"
#include "hpm/cli/run_config.h"
#include "hpm/io/atomic_file.h"
#include "hpm/pipeline/partition.h"
#include "hpm/pipeline/simulator.h"
#include "hpm/pipeline/strategy.h"
#include "hpm/tensor/random.h"

namespace hpm::cli {

namespace {

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// Projections: the model's total time spread evenly over K stages (v chunks each), so the table
// shows what the schedule alone does to deeper pipelines.
void print_projection(double total_forward_s, double total_backward_s, double total_weight_s,
                      nlohmann::json* report) {
  std::printf(
      "\nprojection (the profiled model's time split evenly over K stages; messages free):\n");
  std::printf("%4s %5s | %-22s | %-22s | %-22s | %-22s\n", "K", "M", "gpipe: step, bubble",
              "1f1b: step, bubble", "interleaved v=2", "zb-h1");
  nlohmann::json rows = nlohmann::json::array();
  for (int k : {2, 4, 8, 16, 32, 64}) {
    for (int m : {k, 4 * k, 8 * k}) {
      std::printf("%4d %5d |", k, m);
      nlohmann::json row{{"stages", k}, {"micro_batches", m}};
      for (auto [kind, v] : std::vector<std::pair<pipeline::ScheduleKind, int>>{
               {pipeline::ScheduleKind::kGPipe, 1},
               {pipeline::ScheduleKind::kOneFOneB, 1},
               {pipeline::ScheduleKind::kInterleaved, 2},
               {pipeline::ScheduleKind::kZeroBubbleH1, 1}}) {
        const pipeline::Schedule s = pipeline::make_schedule(kind, k, m, v);
        // Each micro-batch's share of the mini-batch's work: the pipeline's ideal step is the
        // unsplit step divided by K.
        const double f = total_forward_s / (k * v), b = total_backward_s / (k * v),
                     w = total_weight_s / (k * v);
        pipeline::ChunkCost cost;
        cost.forward_s = f;
        cost.backward_s = b;
        cost.weight_s = w;
        const pipeline::Simulation sim = pipeline::simulate(
            s, std::vector<pipeline::ChunkCost>(static_cast<std::size_t>(k * v), cost));
        const double ideal = m * (total_forward_s + total_backward_s) / k;
        std::printf(" %8.2fx ideal, %5.1f%% |", sim.step_s / ideal, 100 * sim.bubble);
        row[pipeline::schedule_name(kind)] = {{"step_over_ideal", sim.step_s / ideal},
                                              {"bubble", sim.bubble},
                                              {"formula", pipeline::theoretical_bubble(s)}};
      }
      std::printf("\n");
      rows.push_back(row);
    }
  }
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
  Config cfg = load_config(o.config_path, o.overrides);
  const PipelineSection& p = cfg.pipeline;
  const int threads = o.threads > 0 ? o.threads : std::max(1, cfg.threads / p.stages);
  use_threads(threads);
  manual_seed(cfg.seed);
  std::shared_ptr<nn::Sequential> model = nn::as_sequential(build_model(cfg));
  const pipeline::Schedule schedule = pipeline::make_schedule(
      pipeline::schedule_from_name(p.schedule), p.stages, p.micro_batches, p.chunks_per_stage);

  // One micro-batch of the config's own data, as training would see it.
  data::Element first;
  {
    std::int64_t examples = 0;
    std::unique_ptr<data::Iterator> it = training_pipeline(cfg, &examples).make_iterator(0);
    if (!it->next(first)) throw ConfigError(cfg.path + ": the training data yields no batch");
  }
  const Tensor& x = first.at(0);
  const std::int64_t rows = (x.size(0) + p.micro_batches - 1) / p.micro_batches;
  std::printf(
      "hpm plan %s: %zu layers, %lld parameters; micro-batch %lld rows (batch %lld / M %d)\n",
      cfg.path.c_str(), model->size(), static_cast<long long>(model->num_parameters()),
      static_cast<long long>(rows), static_cast<long long>(x.size(0)), p.micro_batches);
  const std::vector<pipeline::LayerCost> layers =
      pipeline::profile_layers(*model, x.narrow(0, rows), p.profile_repeats);
  const pipeline::Partition part =
      pipeline::partition(layers, schedule.chunks(), pipeline::partition_from_name(p.partition));
  std::printf("\npartition (%s) into %d chunk(s) on %d stage(s):\n%s", p.partition.c_str(),
              schedule.chunks(), p.stages, pipeline::describe(part, layers).c_str());

  const std::vector<pipeline::ChunkCost> costs = pipeline::chunk_costs(layers, part.boundaries);
  const pipeline::Simulation sim = pipeline::simulate(schedule, costs, o.message_us * 1e-6);
  double serial = 0;
  for (const auto& c : costs) serial += (c.forward_s + c.backward_s) * p.micro_batches;
  std::printf(
      "\nschedule %s, K = %d, M = %d%s\n", p.schedule.c_str(), p.stages, p.micro_batches,
      p.chunks_per_stage > 1 ? (", v = " + std::to_string(p.chunks_per_stage)).c_str() : "");
  std::printf("  predicted step      %.3f ms (one device, same micro-batches: %.3f ms; %.2fx)\n",
              sim.step_s * 1e3, serial * 1e3, serial / sim.step_s);
  std::printf("  predicted bubble    %.1f%% (formula %.1f%%)\n", 100 * sim.bubble,
              100 * pipeline::theoretical_bubble(schedule));
  nlohmann::json stages = nlohmann::json::array();
  for (int d = 0; d < p.stages; ++d) {
    std::printf("  stage %d: busy %.3f ms, peak memory %.2f MiB\n", d,
                sim.busy_s[static_cast<std::size_t>(d)] * 1e3,
                mib(sim.peak_bytes[static_cast<std::size_t>(d)]));
    stages.push_back({{"busy_s", sim.busy_s[static_cast<std::size_t>(d)]},
                      {"peak_bytes", sim.peak_bytes[static_cast<std::size_t>(d)]}});
  }
  nlohmann::json layer_json = nlohmann::json::array();
  double total_f = 0, total_b = 0, total_w = 0;
  for (const auto& l : layers) {
    total_f += l.forward_s;
    total_b += l.backward_s;
    total_w += l.weight_s;
    layer_json.push_back({{"name", l.name},
                          {"forward_s", l.forward_s},
                          {"backward_s", l.backward_s},
                          {"weight_s", l.weight_s},
                          {"parameter_bytes", l.parameter_bytes},
                          {"activation_bytes", l.activation_bytes}});
  }
  nlohmann::json report{{"schedule", p.schedule},
                        {"stages", p.stages},
                        {"micro_batches", p.micro_batches},
                        {"chunks_per_stage", p.chunks_per_stage},
                        {"partition", p.partition},
                        {"boundaries", part.boundaries},
                        {"imbalance", part.imbalance},
                        {"predicted_step_s", sim.step_s},
                        {"one_device_step_s", serial},
                        {"predicted_bubble", sim.bubble},
                        {"formula_bubble", pipeline::theoretical_bubble(schedule)},
                        {"stage", stages},
                        {"layers", layer_json}};
  if (o.project) print_projection(total_f, total_b, total_w, &report);
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
