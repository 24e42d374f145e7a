// `hpm launch`: its flags, onto the supervisor of the launch layer.
#include "hpm/cli/launch_command.h"

#include <CLI/CLI.hpp>

#include "hpm/cli/options.h"

namespace hpm::cli {

CLI::App* add_launch_command(CLI::App& app, launch::LaunchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "launch", "start N local processes of a program as the ranks of one group");
  auto* nproc =
      cmd->add_option("-n,--nproc", o.processes, "number of ranks")->check(CLI::Range(1, 4096));
  auto* ps = cmd->add_option("--ps", o.ps_tasks,
                             "a parameter-server job: this many parameter-server tasks (with "
                             "--workers; plus one coordinator)")
                 ->check(CLI::Range(1, 1024));
  auto* workers = cmd->add_option("--workers", o.ps_workers, "a parameter-server job's workers")
                      ->check(CLI::Range(1, 4096));
  ps->needs(workers);
  workers->needs(ps);
  nproc->excludes(ps);
  nproc->excludes(workers);
  auto* tcp =
      cmd->add_option("--rendezvous", o.rendezvous,
                      "HOST:PORT of the TCP store rank 0 will host (port 0: any free port)");
  auto* dir = cmd->add_option(
      "--rendezvous-dir", o.rendezvous_dir,
      "where to make the run's FileStore directory (default: the temporary directory)");
  tcp->excludes(dir);
  cmd->add_option("--timeout", o.timeout_s,
                  "rendezvous and collective timeout for the ranks, seconds (HPM_TIMEOUT)")
      ->check(positive_number());
  cmd->add_option("--grace", o.grace_s,
                  "seconds from SIGTERM to SIGKILL when stopping the ranks (default 5)")
      ->check(non_negative_number());
  cmd->add_option("--max-restarts", o.max_restarts,
                  "restart the whole group up to this many times when a rank fails (default 0)")
      ->check(non_negative_number());
  cmd->add_option("--restart-delay", o.restart_delay_s,
                  "seconds before the first restart, doubled before each next (default 1)")
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("command", o.command, "PROGRAM ARGS... (after --; PROGRAM is looked up in PATH)")
      ->required();
  cmd->footer(launch::kHelpFooter);
  return cmd;
}

}  // namespace hpm::cli
