// `hpm`: the subcommands, each in its own file (flags -> configuration -> one call into the
// library -> what it prints); this file parses the command line and maps errors to exit codes.
#include "hpm/cli/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "hpm/cli/bench.h"
#include "hpm/cli/data_command.h"
#include "hpm/cli/distill_command.h"
#include "hpm/cli/evaluate_command.h"
#include "hpm/cli/export_command.h"
#include "hpm/cli/launch_command.h"
#include "hpm/cli/plan.h"
#include "hpm/cli/plot.h"
#include "hpm/cli/ps_command.h"
#include "hpm/cli/sample_command.h"
#include "hpm/cli/train_command.h"
#include "hpm/comm/communicator.h"
#include "hpm/io/atomic_file.h"
#include "hpm/launch/supervisor.h"
#include "hpm/launch/worker.h"
#include "hpm/tensor/device.h"

namespace hpm::cli {

namespace {

// Every --report of the command line, checked before any work: a missing directory, or a path
// that is a FIFO or a device, is an error now, not after the training.
void check_report_paths(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    if (const CLI::Option* o = sub->get_option_no_throw("--report"); o && o->count() > 0)
      io::output_file_target(o->as<std::string>());
    check_report_paths(*sub);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hpm: high-performance model training"};
  app.require_subcommand(1);
  TrainCommandOptions train_opts;
  CLI::App* train_cmd = add_train_command(app, train_opts);
  EvaluateCommandOptions eval_opts;
  CLI::App* eval_cmd = add_evaluate_command(app, eval_opts);
  DataCommandOptions data_opts;
  CLI::App* data_cmd = add_data_command(app, data_opts);
  AllreduceBenchOptions allreduce_bench;
  CLI::App* allreduce_cmd = add_bench_command(app, allreduce_bench);
  launch::LaunchOptions launch_opts;
  CLI::App* launch_cmd = add_launch_command(app, launch_opts);
  DistillCommandOptions distill_opts;
  CLI::App* distill_cmd = add_distill_command(app, distill_opts);
  ChurnCommandOptions churn_opts;
  CLI::App* churn_cmd = add_churn_command(app, churn_opts);
  CodistillCommandOptions codistill_opts;
  CLI::App* codistill_cmd = add_codistill_command(app, codistill_opts);
  PlanCommandOptions plan_opts;
  CLI::App* plan_cmd = add_plan_command(app, plan_opts);
  PsCommandOptions ps_opts;
  CLI::App* ps_cmd = add_ps_command(app, ps_opts);
  SampleCommandOptions sample_opts;
  CLI::App* sample_cmd = add_sample_command(app, sample_opts);
  ExportCommandOptions export_opts;
  CLI::App* export_cmd = add_export_command(app, export_opts);
  PlotCommandOptions plot_opts;
  CLI::App* plot_cmd = add_plot_command(app, plot_opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    launch::watch_launcher_from_env();
    check_report_paths(app);
    if (*launch_cmd) return launch::run_launch(launch_opts);
    if (*train_cmd) return run_train(train_opts);
    if (*eval_cmd) return run_evaluate(eval_opts);
    if (*export_cmd) return run_export(export_opts);
    if (*plot_cmd) return run_plot(plot_opts);
    if (*data_cmd) return run_data_command(data_opts);
    if (*allreduce_cmd) return run_bench_allreduce(allreduce_bench);
    if (*distill_cmd) return run_distill(distill_opts);
    if (*churn_cmd) return run_churn(churn_opts);
    if (*codistill_cmd) return run_codistill(codistill_opts);
    if (*plan_cmd) return run_plan(plan_opts);
    if (*ps_cmd) return run_ps_command(ps_opts);
    if (*sample_cmd) return run_sample(sample_opts);
  } catch (const comm::CommError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return launch::kExitPeerLost;
  } catch (const OutOfMemoryError& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return launch::kExitOutOfMemory;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hpm: error: %s\n", e.what());
    return 1;
  }
  return 2;
}

}  // namespace hpm::cli
